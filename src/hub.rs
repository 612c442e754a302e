//! Hugging Face Hub ids as checkpoints: `ORG/NAME[@REVISION]` resolved to a snapshot folder of
//! the standard Hub cache (`$HF_HUB_CACHE`, else `$HF_HOME/hub`, else
//! `$XDG_CACHE_HOME/huggingface/hub` or `~/.cache/huggingface/hub`), in the layout the
//! `huggingface_hub` Python library uses — `models--ORG--NAME/{blobs/<etag>,
//! snapshots/<commit>/<file> → ../../blobs/<etag>, refs/<revision>, .no_exist/<commit>/<file>}`
//! — so that both share one cache.
//!
//! Downloads go through the `hf-hub` crate's blocking client (its resumable `.part` files, its
//! lock, its cache writes); this module adds what that client leaves out: `HF_TOKEN`,
//! `HF_HUB_OFFLINE=1` (the cache only, naming what it lacks), the files a Whisper conversion
//! reads (config and tokenizer files, the weights in the order the loader tries them, a shard
//! index's shards), the negative cache for optional files (`.no_exist`), a check of every
//! downloaded blob's length against the server's and of its sha256 against the etag where the
//! etag is one (the Hub's `x-linked-etag` of LFS files), removing a blob that fails, and errors
//! that name the repository, revision, file and URL. Uses nothing else of milkit.

use anyhow::{anyhow, bail, Context, Result};
use hf_hub::api::sync::{ApiBuilder, ApiError, ApiRepo};
use hf_hub::api::Progress;
use hf_hub::{Repo, RepoType};
use indicatif::{ProgressBar, ProgressStyle};
use sha2::{Digest, Sha256};
use std::cell::Cell;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::rc::Rc;

/// The default Hub endpoint (`HF_ENDPOINT` replaces it).
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// Files a conversion reads when the repository has them; none is required (the loader
/// derives or reports what is missing).
pub const OPTIONAL_FILES: [&str; 3] = [
    "generation_config.json",
    "preprocessor_config.json",
    "tokenizer.json",
];

/// The weights, in the order the checkpoint loader tries them: the first one the repository
/// has is downloaded (an index with every shard it names).
pub const WEIGHT_FILES: [&str; 4] = [
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
];

/// A model repository on the Hub and the revision (branch, tag or commit) to use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HubId {
    /// `ORG/NAME`.
    pub repo: String,
    /// The revision after `@`, `main` when none is given.
    pub revision: String,
}

impl HubId {
    /// Parses `ORG/NAME[@REVISION]`: names of ASCII letters, digits, `-`, `_` and `.` (not
    /// starting with `.` or `-`, without `--` or `..`, as the Hub allows), a revision of
    /// those and `/` without empty or `..` components. `None` for anything else, so that a
    /// mistyped path is never taken for a repository.
    pub fn parse(s: &str) -> Option<HubId> {
        let (repo, revision) = match s.split_once('@') {
            Some((r, rev)) => (r, rev),
            None => (s, "main"),
        };
        let (org, name) = repo.split_once('/')?;
        let name_ok = |n: &str| {
            !n.is_empty()
                && n.len() <= 96
                && n.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
                && !n.starts_with(['.', '-'])
                && !n.contains("--")
                && !n.contains("..")
        };
        let rev_ok = !revision.is_empty()
            && revision.len() <= 255
            && revision
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'/'))
            && revision
                .split('/')
                .all(|c| !c.is_empty() && c != "." && c != "..");
        (name_ok(org) && name_ok(name) && rev_ok).then(|| HubId {
            repo: repo.to_string(),
            revision: revision.to_string(),
        })
    }

    /// The repository's folder in the cache (`models--ORG--NAME`).
    pub fn folder_name(&self) -> String {
        format!("models--{}", self.repo.replace('/', "--"))
    }
}

impl std::fmt::Display for HubId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@{}", self.repo, self.revision)
    }
}

/// Where the cache is and how to reach the Hub, from the `huggingface_hub` variables.
#[derive(Clone, Debug)]
pub struct HubEnv {
    /// The hub cache directory (holding `models--ORG--NAME` folders).
    pub cache_dir: PathBuf,
    /// `HF_ENDPOINT` without a trailing `/`, or [`DEFAULT_ENDPOINT`].
    pub endpoint: String,
    /// `HF_TOKEN` (or the legacy `HUGGING_FACE_HUB_TOKEN`), else the token file
    /// (`HF_TOKEN_PATH`, else `$HF_HOME/token`) that `huggingface-cli login` writes.
    pub token: Option<String>,
    /// `HF_HUB_OFFLINE` is 1 / on / yes / true: the cache only, no request.
    pub offline: bool,
}

impl HubEnv {
    /// From the process environment.
    pub fn from_env() -> Result<HubEnv> {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    /// From a lookup of environment variables (empty values count as unset).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<HubEnv> {
        let var = |k: &str| var(k).filter(|v| !v.trim().is_empty());
        let home = match var("HF_HOME") {
            Some(h) => Some(PathBuf::from(h)),
            None => match var("XDG_CACHE_HOME") {
                Some(x) => Some(PathBuf::from(x).join("huggingface")),
                None => var("HOME")
                    .or_else(|| var("USERPROFILE"))
                    .map(|h| PathBuf::from(h).join(".cache/huggingface")),
            },
        };
        let cache_dir = match (var("HF_HUB_CACHE"), &home) {
            (Some(c), _) => PathBuf::from(c),
            (None, Some(h)) => h.join("hub"),
            (None, None) => bail!(
                "cannot find the Hugging Face cache: HOME is unset (set HF_HOME or HF_HUB_CACHE)"
            ),
        };
        let cache_dir = std::path::absolute(&cache_dir).unwrap_or(cache_dir);
        let endpoint = var("HF_ENDPOINT")
            .map(|e| e.trim().trim_end_matches('/').to_string())
            .unwrap_or_else(|| DEFAULT_ENDPOINT.to_string());
        let token_file = var("HF_TOKEN_PATH")
            .map(PathBuf::from)
            .or_else(|| home.map(|h| h.join("token")));
        let token = var("HF_TOKEN")
            .or_else(|| var("HUGGING_FACE_HUB_TOKEN"))
            .or_else(|| token_file.and_then(|f| std::fs::read_to_string(f).ok()))
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty());
        let offline = var("HF_HUB_OFFLINE").is_some_and(|v| {
            matches!(
                v.trim().to_ascii_uppercase().as_str(),
                "1" | "ON" | "YES" | "TRUE"
            )
        });
        Ok(HubEnv {
            cache_dir,
            endpoint,
            token,
            offline,
        })
    }
}

/// A `--model` argument: an existing path as it is; else `ORG/NAME[@REVISION]`, downloaded
/// (or found) in the Hub cache, as its snapshot folder. `progress`: a bar per download on
/// stderr.
pub fn resolve_model(arg: &Path, progress: bool) -> Result<PathBuf> {
    if arg.exists() {
        return Ok(arg.to_path_buf());
    }
    let Some(id) = arg.to_str().and_then(HubId::parse) else {
        bail!(
            "checkpoint {} does not exist (and is no Hugging Face Hub id ORG/NAME[@REVISION])",
            arg.display()
        );
    };
    let env = HubEnv::from_env()?;
    snapshot(&id, &env, progress).with_context(|| {
        format!(
            "no directory {}, so it was read as a Hugging Face Hub model id",
            arg.display()
        )
    })
}

/// What the cache knows of one file of one commit.
enum Cached {
    Present(PathBuf),
    Absent,
    Unknown,
}

/// Resolves `id` to a snapshot folder holding the files a conversion reads: from the cache
/// alone when it has them all (no request at all, so a second run works without network),
/// else downloading what it lacks — pinned to the commit the first answer names, so that
/// every file comes from one commit. Offline, a cache without them fails naming the files.
pub fn snapshot(id: &HubId, env: &HubEnv, progress: bool) -> Result<PathBuf> {
    let mut f = Fetcher::new(id, env, progress)?;
    let config = f.get("config.json", true)?;
    for name in OPTIONAL_FILES {
        f.get(name, false)?;
    }
    let mut weights = None;
    for name in WEIGHT_FILES {
        if let Some(p) = f.get(name, false)? {
            weights = Some((name, p));
            break;
        }
    }
    match &weights {
        Some((name, index)) if name.ends_with(".index.json") => {
            for shard in shard_names(index)? {
                f.get(&shard, true)?;
            }
        }
        Some(_) => {}
        None if env.offline => f
            .missing
            .push(format!("one of {}", WEIGHT_FILES.join(", "))),
        None => bail!(
            "{id}: the repository has none of the weights files {} (looked up at {})",
            WEIGHT_FILES.join(", "),
            f.url("model.safetensors")
        ),
    }
    f.none_missing()?;
    let config = config.context("config.json resolved to nothing")?;
    Ok(config
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| config.clone()))
}

/// Resolves `id` to a snapshot folder holding the listed files (paths inside the
/// repository, `/`-separated; `true`: required), from the cache alone when it has them,
/// else downloading what it lacks, all from one commit — as [`snapshot`] does for a
/// checkpoint. Offline, a cache without a required file fails naming it.
pub fn snapshot_files(
    id: &HubId,
    env: &HubEnv,
    files: &[(&str, bool)],
    progress: bool,
) -> Result<PathBuf> {
    let mut f = Fetcher::new(id, env, progress)?;
    let mut root = None;
    for &(name, required) in files {
        if let Some(p) = f.get(name, required)? {
            // The snapshot folder: the file's path less its own components.
            let depth = Path::new(name).components().count();
            root = p.ancestors().nth(depth).map(Path::to_path_buf);
        }
    }
    f.none_missing()?;
    root.with_context(|| format!("{id}: none of the files {files:?} resolved"))
}

/// The shard file names a `*.index.json` maps tensors to (plain names only).
fn shard_names(index: &Path) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(index)
        .with_context(|| format!("cannot read shard index {}", index.display()))?;
    let json: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("shard index {}: malformed JSON", index.display()))?;
    let map = json
        .get("weight_map")
        .and_then(|m| m.as_object())
        .with_context(|| format!("shard index {}: missing \"weight_map\"", index.display()))?;
    let mut names: Vec<String> = Vec::new();
    for v in map.values() {
        let s = v.as_str().unwrap_or_default();
        if s.is_empty() || Path::new(s).file_name() != Some(s.as_ref()) {
            bail!(
                "shard index {}: shard name {v} is not a plain file name",
                index.display()
            );
        }
        if !names.iter().any(|n| n == s) {
            names.push(s.to_string());
        }
    }
    Ok(names)
}

fn is_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Cache look-ups and downloads of one repository, pinned to one commit once known.
struct Fetcher<'a> {
    id: &'a HubId,
    env: &'a HubEnv,
    progress: bool,
    repo_dir: PathBuf,
    commit: Option<String>,
    api: Option<ApiRepo>,
    /// Required files neither cached nor downloadable (offline).
    missing: Vec<String>,
}

impl<'a> Fetcher<'a> {
    fn new(id: &'a HubId, env: &'a HubEnv, progress: bool) -> Result<Fetcher<'a>> {
        let repo_dir = env.cache_dir.join(id.folder_name());
        let commit = if is_hex(&id.revision, 40) {
            Some(id.revision.to_ascii_lowercase())
        } else {
            std::fs::read_to_string(repo_dir.join("refs").join(&id.revision))
                .ok()
                .map(|c| c.trim().to_string())
                .filter(|c| is_hex(c, 40))
        };
        Ok(Fetcher {
            id,
            env,
            progress,
            repo_dir,
            commit,
            api: None,
            missing: Vec::new(),
        })
    }

    /// Offline, an error naming every required file the cache lacks.
    fn none_missing(&self) -> Result<()> {
        if self.missing.is_empty() {
            return Ok(());
        }
        bail!(
            "HF_HUB_OFFLINE is set and the Hub cache {} lacks {} of {}; run once without \
             HF_HUB_OFFLINE to download {}",
            self.env.cache_dir.display(),
            self.missing.join(", "),
            self.id,
            if self.missing.len() == 1 {
                "it"
            } else {
                "them"
            }
        );
    }

    /// The URL a file is asked for at: by the commit once known, else the revision.
    fn url(&self, file: &str) -> String {
        let rev = self.commit.as_deref().unwrap_or(&self.id.revision);
        format!(
            "{}/{}/resolve/{}/{file}",
            self.env.endpoint,
            self.id.repo,
            rev.replace('/', "%2F")
        )
    }

    fn cached(&self, file: &str) -> Cached {
        let Some(c) = &self.commit else {
            return Cached::Unknown;
        };
        let p = self.repo_dir.join("snapshots").join(c).join(file);
        if p.is_file() {
            Cached::Present(p)
        } else if self.repo_dir.join(".no_exist").join(c).join(file).exists() {
            Cached::Absent
        } else {
            Cached::Unknown
        }
    }

    /// The cached or downloaded file; `None` when the repository does not have it (a
    /// required one is an error then) or, offline, when the cache does not know it (a
    /// required one is recorded in `missing`).
    fn get(&mut self, file: &str, required: bool) -> Result<Option<PathBuf>> {
        match self.cached(file) {
            Cached::Present(p) => return Ok(Some(p)),
            Cached::Absent if required => bail!(
                "{}: {file} does not exist in the repository (the cache {} recorded a 404 \
                 for it)",
                self.id,
                self.repo_dir.display()
            ),
            Cached::Absent => return Ok(None),
            Cached::Unknown => {}
        }
        if self.env.offline {
            if required {
                self.missing.push(file.to_string());
            }
            return Ok(None);
        }
        self.download(file, required)
    }

    fn api(&mut self) -> Result<&ApiRepo> {
        if self.api.is_none() {
            // (`ApiBuilder::new` panics without a home directory; the cache is ours anyway.)
            let api = ApiBuilder::from_cache(hf_hub::Cache::new(self.env.cache_dir.clone()))
                .with_endpoint(self.env.endpoint.clone())
                .with_token(self.env.token.clone())
                .with_progress(false)
                .with_user_agent("milkit", env!("CARGO_PKG_VERSION"))
                .build()
                .map_err(|e| anyhow!("cannot set up the Hub client: {e}"))?;
            // Pinned to the commit once known, so every file comes from the same one.
            let rev = self.commit.clone().unwrap_or(self.id.revision.clone());
            self.api = Some(api.repo(Repo::with_revision(
                self.id.repo.clone(),
                RepoType::Model,
                rev,
            )));
        }
        Ok(self.api.as_ref().expect("set above"))
    }

    fn download(&mut self, file: &str, required: bool) -> Result<Option<PathBuf>> {
        let url = self.url(file);
        if let Some(c) = &self.commit {
            // A link whose blob was deleted: hf-hub would fail to link the new download.
            let link = self.repo_dir.join("snapshots").join(c).join(file);
            if link.symlink_metadata().is_ok() && !link.exists() {
                let _ = std::fs::remove_file(&link);
            }
        }
        let state = Rc::new(DownloadState::default());
        let bar = Bar {
            pb: if self.progress {
                Some(ProgressBar::new(0))
            } else {
                None
            },
            state: state.clone(),
        };
        let api = self.api()?;
        // hf-hub asserts on a few malformed answers; a panic there is an error here.
        let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            api.download_with_progress(file, bar)
        }))
        .unwrap_or_else(|_| {
            Err(ApiError::IoError(std::io::Error::other(
                "the Hub client failed on a malformed answer",
            )))
        });
        let pointer = match res {
            Ok(p) => p,
            Err(e) => return self.failed(file, required, &url, &state, e),
        };
        let commit = pointer
            .parent()
            .and_then(|d| d.file_name())
            .and_then(|c| c.to_str())
            .map(str::to_string)
            .filter(|c| is_hex(c, 40))
            .with_context(|| {
                format!(
                    "{}: {file} was stored at {}, not in a commit's snapshot",
                    self.id,
                    pointer.display()
                )
            })?;
        self.verify(file, &url, &pointer, &state)?;
        if self.commit.is_none() {
            self.commit = Some(commit);
            // Later files by the commit, not the branch, which may move meanwhile.
            self.api = None;
        }
        Ok(Some(pointer))
    }

    /// Length against the server's, sha256 against an etag that is one; a failing blob and
    /// its snapshot link are removed (nothing half-written stays in the cache).
    fn verify(&self, file: &str, url: &str, pointer: &Path, state: &DownloadState) -> Result<()> {
        let blob = std::fs::canonicalize(pointer)
            .with_context(|| format!("{}: cannot follow {}", self.id, pointer.display()))?;
        let etag = blob
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_string();
        let _ = std::fs::remove_file(blob.with_extension("lock"));
        let len = std::fs::metadata(&blob)?.len();
        let expected = state.size.get();
        let problem = if len != expected {
            Some(format!(
                "the download holds {len} bytes where the server announced {expected}"
            ))
        } else if is_hex(&etag, 64) {
            let got = sha256_file(&blob)?;
            (!got.eq_ignore_ascii_case(&etag))
                .then(|| format!("its sha256 is {got}, the Hub's etag says {etag}"))
        } else {
            None
        };
        if let Some(problem) = problem {
            let _ = std::fs::remove_file(pointer);
            let _ = std::fs::remove_file(&blob);
            bail!(
                "{}: {file} from {url} is damaged ({problem}); it was removed from the cache, \
                 run again to download it anew",
                self.id
            );
        }
        Ok(())
    }

    fn failed(
        &mut self,
        file: &str,
        required: bool,
        url: &str,
        state: &DownloadState,
        e: ApiError,
    ) -> Result<Option<PathBuf>> {
        let id = self.id;
        match e {
            ApiError::RequestError(e) => match *e {
                ureq::Error::Status(code, resp) => {
                    let error_code = resp.header("x-error-code").unwrap_or_default().to_string();
                    let commit = resp
                        .header("x-repo-commit")
                        .map(str::to_string)
                        .filter(|c| is_hex(c, 40))
                        .or(self.commit.clone());
                    match (code, error_code.as_str()) {
                        (404, "RepoNotFound") | (401, _) => bail!(
                            "{id}: the repository {} does not exist, or is private or gated and \
                             needs a token{} (HTTP {code} at {url})",
                            id.repo,
                            if self.env.token.is_some() {
                                " that can read it"
                            } else {
                                " (set HF_TOKEN)"
                            }
                        ),
                        (404, "RevisionNotFound") => bail!(
                            "{id}: the repository has no revision {} (HTTP 404 at {url})",
                            id.revision
                        ),
                        (404, _) if !required => {
                            if let Some(c) = commit {
                                let p = self.repo_dir.join(".no_exist").join(&c).join(file);
                                if let Some(d) = p.parent() {
                                    let _ = std::fs::create_dir_all(d);
                                }
                                let _ = std::fs::write(&p, b"");
                                if self.commit.is_none() {
                                    self.commit = Some(c);
                                    self.api = None;
                                }
                            }
                            Ok(None)
                        }
                        (404, _) => bail!(
                            "{id}: the repository has no {file} at revision {} (HTTP 404 at \
                             {url})",
                            id.revision
                        ),
                        (403, _) => bail!(
                            "{id}: access to {file} refused (HTTP 403 at {url}); a gated model \
                             needs its terms accepted on the Hub and HF_TOKEN set"
                        ),
                        _ => bail!(
                            "{id}: downloading {file} failed: HTTP {code} {} at {url}",
                            resp.status_text()
                        ),
                    }
                }
                ureq::Error::Transport(t) => bail!(
                    "{id}: cannot reach the Hub at {} for {file} ({t}); set HF_HUB_OFFLINE=1 to \
                     use only the cache {}",
                    self.env.endpoint,
                    self.env.cache_dir.display()
                ),
            },
            ApiError::MissingHeader(h) | ApiError::InvalidHeader(h) => bail!(
                "{id}: the answer for {file} from {url} has no valid `{h}` header; is {} a \
                 Hugging Face Hub endpoint (HF_ENDPOINT)?",
                self.env.endpoint
            ),
            ApiError::IoError(io) if state.size.get() > 0 => {
                let part = self.partial_file();
                if let Some(p) = &part {
                    let _ = std::fs::remove_file(p.with_extension("lock"));
                }
                bail!(
                    "{id}: the download of {file} from {url} broke off after {} of {} bytes \
                     ({io}){}",
                    state.received.get(),
                    state.size.get(),
                    match part {
                        Some(p) => format!(
                            "; nothing was added to the snapshot, and the next run resumes \
                             from the partial file {}",
                            p.display()
                        ),
                        None => String::new(),
                    }
                )
            }
            other => bail!("{id}: downloading {file} from {url} failed: {other}"),
        }
    }

    /// The newest `blobs/*.part` file (a broken-off download's), if any.
    fn partial_file(&self) -> Option<PathBuf> {
        std::fs::read_dir(self.repo_dir.join("blobs"))
            .ok()?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "part"))
            .max_by_key(|p| p.metadata().and_then(|m| m.modified()).ok())
    }
}

impl Drop for Fetcher<'_> {
    /// hf-hub writes `refs/<revision>` for the revision it was asked for; a ref named after
    /// a commit (our pinning) is not one `huggingface_hub` writes, so it goes.
    fn drop(&mut self) {
        let refs = self.repo_dir.join("refs");
        if let Some(c) = &self.commit {
            if *c != self.id.revision {
                let _ = std::fs::remove_file(refs.join(c));
            }
        }
        if is_hex(&self.id.revision, 40) {
            let _ = std::fs::remove_file(refs.join(&self.id.revision));
        }
        let _ = std::fs::remove_dir(refs);
    }
}

fn sha256_file(path: &Path) -> Result<String> {
    let mut f =
        std::fs::File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// What hf-hub reports of one download: the size the server announced and the bytes
/// received (counting a resumed part file's).
#[derive(Default)]
struct DownloadState {
    size: Cell<u64>,
    received: Cell<u64>,
}

/// hf-hub's progress callbacks → an indicatif bar on stderr (when asked for) and the state.
struct Bar {
    pb: Option<ProgressBar>,
    state: Rc<DownloadState>,
}

impl Progress for Bar {
    fn init(&mut self, size: usize, filename: &str) {
        self.state.size.set(size as u64);
        self.state.received.set(0);
        if let Some(pb) = &self.pb {
            pb.set_length(size as u64);
            pb.set_position(0);
            pb.set_style(
                ProgressStyle::with_template(
                    "{msg:>12} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} {eta}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
            );
            pb.set_message(filename.to_string());
        }
    }

    fn update(&mut self, size: usize) {
        self.state
            .received
            .set(self.state.received.get() + size as u64);
        if let Some(pb) = &self.pb {
            pb.inc(size as u64);
        }
    }

    fn finish(&mut self) {
        if let Some(pb) = &self.pb {
            pb.finish_and_clear();
        }
    }
}
