//! `--model ORG/NAME[@REVISION]` against a local Hub: a minimal HTTP/1.1 server on 127.0.0.1
//! (in a thread of the test) serving the routes the Hub client uses — `GET|HEAD
//! /{repo}/resolve/{revision}/{file}` with `x-repo-commit`, `etag` / `x-linked-etag`, ranges
//! (`Content-Range`, 206) and the Hub's 404s — for a synthetic checkpoint the test writes. No
//! internet. Cases: download into a fresh `HF_HOME` and a real conversion (byte-identical to
//! one from the local folder), the huggingface_hub cache layout, `HF_TOKEN` sent as a bearer
//! token, a second run with no request at all, `HF_HUB_OFFLINE=1` with a warm and a cold
//! cache, a 404 for a required file, a truncated and a corrupt download (clear errors,
//! nothing half-written in the snapshot, the truncated one resumed by the next run), and a
//! sharded repository (index and shards) exported as a whole models folder. The environment
//! is set on the child processes only.

mod common;
use common::milkit;
use milkit::hub::{HubEnv, HubId};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const REPO: &str = "test-org/tiny-synth";
const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    /// Announce the whole length, send this many bytes of the body, close.
    Truncate(usize),
    /// Send the full length with one byte changed.
    Corrupt,
}

#[derive(Clone, Debug)]
struct Req {
    method: String,
    path: String,
    range: Option<String>,
    auth: Option<String>,
}

#[derive(Default)]
struct State {
    files: BTreeMap<String, Vec<u8>>,
    modes: BTreeMap<String, Mode>,
    log: Vec<Req>,
}

/// The local Hub: serves `REPO` at revision `main` and `COMMIT`.
struct Hub {
    port: u16,
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn sha256(b: &[u8]) -> String {
    hex(&Sha256::digest(b))
}

impl Hub {
    /// Serves every file of `dir` except those in `skip`.
    fn serve(dir: &Path, skip: &[&str]) -> Hub {
        let mut st = State::default();
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let name = p.file_name().unwrap().to_str().unwrap().to_string();
            if !skip.contains(&name.as_str()) {
                st.files.insert(name, std::fs::read(&p).unwrap());
            }
        }
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(Mutex::new(st));
        let stop = Arc::new(AtomicBool::new(false));
        let (s2, stop2) = (state.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stop2.load(Ordering::SeqCst) {
                    break;
                }
                if let Ok(c) = conn {
                    let _ = handle(c, &s2);
                }
            }
        });
        Hub {
            port,
            state,
            stop,
            thread: Some(thread),
        }
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn log(&self) -> Vec<Req> {
        self.state.lock().unwrap().log.clone()
    }

    fn set_mode(&self, file: &str, mode: Option<Mode>) {
        let mut st = self.state.lock().unwrap();
        match mode {
            Some(m) => st.modes.insert(file.to_string(), m),
            None => st.modes.remove(file),
        };
    }

    fn file(&self, name: &str) -> Vec<u8> {
        self.state.lock().unwrap().files[name].clone()
    }

    /// Stops serving: later connections are refused.
    fn shut(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

impl Drop for Hub {
    fn drop(&mut self) {
        self.shut();
    }
}

/// One request, one answer, then the connection closes.
fn handle(mut c: TcpStream, state: &Mutex<State>) -> std::io::Result<()> {
    c.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut r = BufReader::new(c.try_clone()?);
    let mut line = String::new();
    r.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_string();
    let path = parts.next().unwrap_or_default().to_string();
    let mut headers = BTreeMap::new();
    loop {
        let mut h = String::new();
        if r.read_line(&mut h)? == 0 || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let req = Req {
        method: method.clone(),
        path: path.clone(),
        range: headers.get("range").cloned(),
        auth: headers.get("authorization").cloned(),
    };
    let mut st = state.lock().unwrap();
    st.log.push(req.clone());
    let prefix = format!("/{REPO}/resolve/");
    let Some(rest) = path.strip_prefix(&prefix) else {
        let body = b"{\"error\":\"Repository not found\"}";
        return reply(
            &mut c,
            "401 Unauthorized",
            &[("X-Error-Code", "RepoNotFound".into())],
            body,
            None,
        );
    };
    let (rev, file) = rest.split_once('/').unwrap_or((rest, ""));
    if rev != "main" && rev != COMMIT {
        let body = b"{\"error\":\"Revision not found\"}";
        return reply(
            &mut c,
            "404 Not Found",
            &[("X-Error-Code", "RevisionNotFound".into())],
            body,
            None,
        );
    }
    let commit = ("x-repo-commit", COMMIT.to_string());
    let Some(data) = st.files.get(file).cloned() else {
        let body = b"{\"error\":\"Entry not found\"}";
        let hs = [("X-Error-Code", "EntryNotFound".into()), commit];
        return reply(&mut c, "404 Not Found", &hs, body, None);
    };
    let lfs = file.ends_with(".safetensors") || file.ends_with(".bin");
    let etag = if lfs {
        ("x-linked-etag", format!("\"{}\"", sha256(&data)))
    } else {
        ("etag", format!("\"{}\"", &sha256(&data)[..40]))
    };
    let total = data.len();
    let (status, start, end) = match req.range.as_deref().and_then(|r| r.strip_prefix("bytes=")) {
        Some(r) => {
            let (a, b) = r.split_once('-').unwrap();
            let a: usize = a.parse().unwrap();
            let b: usize = if b.is_empty() {
                total - 1
            } else {
                b.parse().unwrap()
            };
            ("206 Partial Content", a, b.min(total - 1))
        }
        None => ("200 OK", 0, total - 1),
    };
    let mut body = data[start..=end].to_vec();
    let probe = req.range.as_deref() == Some("bytes=0-0");
    let mode = if probe {
        None
    } else {
        st.modes.get(file).copied()
    };
    drop(st);
    let mut hs = vec![commit, etag];
    if status.starts_with("206") {
        hs.push(("Content-Range", format!("bytes {start}-{end}/{total}")));
    }
    let announced = body.len();
    let mut send = None;
    match mode {
        Some(Mode::Truncate(n)) => send = Some(n.min(body.len())),
        Some(Mode::Corrupt) => {
            let last = body.len() - 1;
            body[last] ^= 0xff;
        }
        None => {}
    }
    let body = if method == "HEAD" {
        &body[..0]
    } else {
        &body[..]
    };
    reply_len(&mut c, status, &hs, body, announced, send)
}

fn reply(
    c: &mut TcpStream,
    status: &str,
    hs: &[(&str, String)],
    body: &[u8],
    send: Option<usize>,
) -> std::io::Result<()> {
    reply_len(c, status, hs, body, body.len(), send)
}

fn reply_len(
    c: &mut TcpStream,
    status: &str,
    hs: &[(&str, String)],
    body: &[u8],
    announced: usize,
    send: Option<usize>,
) -> std::io::Result<()> {
    let mut head =
        format!("HTTP/1.1 {status}\r\nContent-Length: {announced}\r\nConnection: close\r\n");
    for (k, v) in hs {
        head += &format!("{k}: {v}\r\n");
    }
    head += "\r\n";
    c.write_all(head.as_bytes())?;
    c.write_all(&body[..send.unwrap_or(body.len()).min(body.len())])?;
    c.flush()?;
    c.shutdown(std::net::Shutdown::Both)
}

/// A small synthetic checkpoint (tiny's layout, d_model 64, one layer each).
fn synth(out: &Path) {
    let o = milkit()
        .args([
            "synth",
            "--preset",
            "tiny",
            "--d-model",
            "64",
            "--heads",
            "2",
            "--ffn-dim",
            "128",
            "--encoder-layers",
            "1",
            "--decoder-layers",
            "1",
            "--quiet",
            "--out",
        ])
        .arg(out)
        .output()
        .unwrap();
    ok(&o);
}

fn ok(o: &Output) {
    assert!(
        o.status.success(),
        "failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

fn err(o: &Output) -> String {
    assert!(!o.status.success(), "unexpectedly succeeded");
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `milkit export --component encoder --model MODEL --out OUT` with the Hub variables of
/// `env` only (HF_HOME set, proxies and every other HF_* variable removed).
fn export(model: &str, out: &Path, hf_home: &Path, env: &[(&str, &str)]) -> Output {
    export_component("encoder", model, out, hf_home, env)
}

/// [`export`] of another component.
fn export_component(
    component: &str,
    model: &str,
    out: &Path,
    hf_home: &Path,
    env: &[(&str, &str)],
) -> Output {
    let mut c = milkit();
    c.args([
        "export",
        "--component",
        component,
        "--quiet",
        "--model",
        model,
        "--out",
    ])
    .arg(out);
    for k in [
        "HF_ENDPOINT",
        "HF_TOKEN",
        "HF_TOKEN_PATH",
        "HUGGING_FACE_HUB_TOKEN",
        "HF_HUB_OFFLINE",
        "HF_HUB_CACHE",
        "XDG_CACHE_HOME",
        "ALL_PROXY",
        "all_proxy",
        "HTTPS_PROXY",
        "https_proxy",
        "HTTP_PROXY",
        "http_proxy",
    ] {
        c.env_remove(k);
    }
    c.env("HF_HOME", hf_home);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

fn repo_dir(hf_home: &Path) -> PathBuf {
    hf_home.join("hub/models--test-org--tiny-synth")
}

/// Every file below `dir` (relative paths), links included.
fn tree(dir: &Path) -> Vec<String> {
    fn walk(base: &Path, d: &Path, out: &mut Vec<String>) {
        let Ok(rd) = std::fs::read_dir(d) else { return };
        for e in rd {
            let p = e.unwrap().path();
            if p.symlink_metadata().unwrap().is_dir() {
                walk(base, &p, out);
            } else {
                out.push(p.strip_prefix(base).unwrap().display().to_string());
            }
        }
    }
    let mut v = vec![];
    walk(dir, dir, &mut v);
    v.sort();
    v
}

fn weights(dir: &Path) -> Vec<u8> {
    std::fs::read(dir.join("Data/com.apple.CoreML/weights/weight.bin")).unwrap()
}

#[test]
fn download_converts_then_hits_the_cache_then_works_offline() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    synth(&ckpt);
    // preprocessor_config.json is not in the repository: an optional file's 404.
    let mut hub = Hub::serve(&ckpt, &["preprocessor_config.json"]);
    let home = dir.path().join("hf");
    let ep = hub.endpoint();
    let out = dir.path().join("a.mlpackage");
    let o = export(
        REPO,
        &out,
        &home,
        &[("HF_ENDPOINT", &ep), ("HF_TOKEN", "hf_secret")],
    );
    ok(&o);
    // The same package as from the local folder, byte for byte.
    let local = dir.path().join("local.mlpackage");
    ok(&export(ckpt.to_str().unwrap(), &local, &home, &[]));
    assert_eq!(weights(&out), weights(&local));

    let log = hub.log();
    assert!(!log.is_empty());
    for r in &log {
        assert_eq!(r.auth.as_deref(), Some("Bearer hf_secret"), "{r:?}");
    }
    // The huggingface_hub layout: refs/main, snapshot links into blobs, the 404 recorded.
    let repo = repo_dir(&home);
    assert_eq!(
        std::fs::read_to_string(repo.join("refs/main")).unwrap(),
        COMMIT
    );
    let snap = repo.join("snapshots").join(COMMIT);
    let st = hub.file("model.safetensors");
    #[cfg(unix)]
    {
        let link = std::fs::read_link(snap.join("model.safetensors")).unwrap();
        assert_eq!(link, Path::new("../../blobs").join(sha256(&st)));
        let link = std::fs::read_link(snap.join("config.json")).unwrap();
        let cfg = hub.file("config.json");
        assert_eq!(link, Path::new("../../blobs").join(&sha256(&cfg)[..40]));
    }
    assert_eq!(
        std::fs::read(repo.join("blobs").join(sha256(&st))).unwrap(),
        st
    );
    assert!(repo
        .join(".no_exist")
        .join(COMMIT)
        .join("preprocessor_config.json")
        .exists());
    let files = tree(&repo);
    assert!(
        files
            .iter()
            .all(|f| !f.ends_with(".part") && !f.ends_with(".lock")),
        "{files:?}"
    );
    assert_eq!(
        files.iter().filter(|f| f.starts_with("refs")).count(),
        1,
        "{files:?}"
    );
    for f in [
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "model.safetensors",
    ] {
        assert!(
            files.contains(&format!("snapshots/{COMMIT}/{f}")),
            "{f}: {files:?}"
        );
    }

    // Second run: everything from the cache, not a single request.
    let n = hub.log().len();
    let out2 = dir.path().join("b.mlpackage");
    ok(&export(REPO, &out2, &home, &[("HF_ENDPOINT", &ep)]));
    assert_eq!(hub.log().len(), n, "a cache hit made requests");
    assert_eq!(weights(&out2), weights(&local));

    // Offline, with the server gone: by branch and by commit.
    hub.shut();
    let out3 = dir.path().join("c.mlpackage");
    ok(&export(
        REPO,
        &out3,
        &home,
        &[("HF_ENDPOINT", &ep), ("HF_HUB_OFFLINE", "1")],
    ));
    let out4 = dir.path().join("d.mlpackage");
    let pinned = format!("{REPO}@{COMMIT}");
    ok(&export(
        &pinned,
        &out4,
        &home,
        &[("HF_ENDPOINT", &ep), ("HF_HUB_OFFLINE", "1")],
    ));
    assert_eq!(weights(&out4), weights(&local));
    // An unknown revision offline: a clear error, no request possible.
    let e = err(&export(
        &format!("{REPO}@v2"),
        &dir.path().join("e.mlpackage"),
        &home,
        &[("HF_ENDPOINT", &ep), ("HF_HUB_OFFLINE", "1")],
    ));
    assert!(
        e.contains("HF_HUB_OFFLINE") && e.contains("config.json"),
        "{e}"
    );
}

#[test]
fn offline_with_a_cold_cache_fails_naming_what_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("hf");
    let out = dir.path().join("a.mlpackage");
    let o = export(
        REPO,
        &out,
        &home,
        &[
            ("HF_ENDPOINT", "http://127.0.0.1:9"),
            ("HF_HUB_OFFLINE", "1"),
        ],
    );
    let e = err(&o);
    for want in [
        "HF_HUB_OFFLINE",
        "config.json",
        "model.safetensors",
        "test-org/tiny-synth@main",
        home.to_str().unwrap(),
    ] {
        assert!(e.contains(want), "missing `{want}` in: {e}");
    }
    assert!(!e.contains("panicked"), "{e}");
    assert!(!out.exists());
    assert!(tree(&home).is_empty(), "{:?}", tree(&home));
}

#[test]
fn a_404_for_a_required_file_names_repo_file_revision_and_url() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    synth(&ckpt);
    let hub = Hub::serve(&ckpt, &["config.json"]);
    let home = dir.path().join("hf");
    let ep = hub.endpoint();
    let out = dir.path().join("a.mlpackage");
    let e = err(&export(REPO, &out, &home, &[("HF_ENDPOINT", &ep)]));
    let url = format!("{ep}/{REPO}/resolve/main/config.json");
    for want in [
        "config.json",
        "HTTP 404",
        &url,
        "test-org/tiny-synth@main",
        "revision main",
    ] {
        assert!(e.contains(want), "missing `{want}` in: {e}");
    }
    assert!(!out.exists());
    assert!(
        tree(&home).iter().all(|f| !f.contains("snapshots")),
        "{:?}",
        tree(&home)
    );
    drop(hub);

    // No weights file at all.
    let hub = Hub::serve(&ckpt, &["model.safetensors"]);
    let ep = hub.endpoint();
    let e = err(&export(
        REPO,
        &out,
        &dir.path().join("hf2"),
        &[("HF_ENDPOINT", &ep)],
    ));
    assert!(
        e.contains("none of the weights files") && e.contains("model.safetensors"),
        "{e}"
    );
    // An unknown repository and an unknown revision.
    let e = err(&export(
        "test-org/nope",
        &out,
        &home,
        &[("HF_ENDPOINT", &ep)],
    ));
    assert!(
        e.contains("test-org/nope") && e.contains("does not exist"),
        "{e}"
    );
    assert!(e.contains("HF_TOKEN"), "{e}");
    let e = err(&export(
        &format!("{REPO}@v9"),
        &out,
        &home,
        &[("HF_ENDPOINT", &ep)],
    ));
    assert!(e.contains("no revision v9"), "{e}");
    // Nothing listening: the endpoint and the offline switch are named.
    drop(hub);
    let e = err(&export(
        REPO,
        &out,
        &dir.path().join("hf3"),
        &[("HF_ENDPOINT", &ep)],
    ));
    assert!(
        e.contains("cannot reach") && e.contains(&ep) && e.contains("HF_HUB_OFFLINE"),
        "{e}"
    );
    assert!(!e.contains("panicked"), "{e}");
}

#[test]
fn a_truncated_download_fails_clearly_and_the_next_run_resumes_it() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    synth(&ckpt);
    let hub = Hub::serve(&ckpt, &[]);
    let st = hub.file("model.safetensors");
    let half = st.len() / 2;
    hub.set_mode("model.safetensors", Some(Mode::Truncate(half)));
    let home = dir.path().join("hf");
    let ep = hub.endpoint();
    let out = dir.path().join("a.mlpackage");
    let e = err(&export(REPO, &out, &home, &[("HF_ENDPOINT", &ep)]));
    for want in [
        "model.safetensors",
        "broke off",
        &format!("after {half} of {} bytes", st.len()),
        "resumes",
    ] {
        assert!(e.contains(want), "missing `{want}` in: {e}");
    }
    assert!(!out.exists());
    let repo = repo_dir(&home);
    let files = tree(&repo);
    let blob = format!("blobs/{}", sha256(&st));
    assert!(!files.contains(&blob), "{files:?}");
    assert!(
        !files.contains(&format!("snapshots/{COMMIT}/model.safetensors")),
        "{files:?}"
    );
    // Only the resumable part file, with what arrived.
    let part = format!("{blob}.part");
    assert!(files.contains(&part), "{files:?}");
    assert!(files.iter().all(|f| !f.ends_with(".lock")), "{files:?}");
    assert_eq!(std::fs::read(repo.join(&part)).unwrap(), st[..half]);

    // The next run asks for the rest only and converts.
    hub.set_mode("model.safetensors", None);
    ok(&export(REPO, &out, &home, &[("HF_ENDPOINT", &ep)]));
    let last = hub
        .log()
        .into_iter()
        .rfind(|r| r.method == "GET" && r.path.ends_with("/model.safetensors"))
        .unwrap();
    assert_eq!(last.range, Some(format!("bytes={half}-")));
    assert!(last.path.contains(COMMIT), "pinned to the commit: {last:?}");
    assert_eq!(std::fs::read(repo.join(&blob)).unwrap(), st);
    assert!(tree(&repo).iter().all(|f| !f.ends_with(".part")));
}

#[test]
fn a_download_failing_its_sha256_is_removed_from_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    synth(&ckpt);
    let hub = Hub::serve(&ckpt, &[]);
    hub.set_mode("model.safetensors", Some(Mode::Corrupt));
    let home = dir.path().join("hf");
    let ep = hub.endpoint();
    let out = dir.path().join("a.mlpackage");
    let e = err(&export(REPO, &out, &home, &[("HF_ENDPOINT", &ep)]));
    let sha = sha256(&hub.file("model.safetensors"));
    for want in ["model.safetensors", "sha256", &sha, "removed"] {
        assert!(e.contains(want), "missing `{want}` in: {e}");
    }
    let files = tree(&repo_dir(&home));
    assert!(
        files
            .iter()
            .all(|f| !f.contains("model.safetensors") && !f.contains(&sha)),
        "{files:?}"
    );
    hub.set_mode("model.safetensors", None);
    ok(&export(REPO, &out, &home, &[("HF_ENDPOINT", &ep)]));
}

#[test]
fn a_missing_path_that_is_no_hub_id_is_a_plain_error() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("a.mlpackage");
    let e = err(&export("./no/such/dir", &out, &dir.path().join("hf"), &[]));
    assert!(
        e.contains("./no/such/dir") && e.contains("does not exist"),
        "{e}"
    );
    assert!(e.contains("no Hugging Face Hub id"), "{e}");
}

#[test]
fn hub_ids_and_environment() {
    let p = |s: &str| HubId::parse(s).map(|h| (h.repo, h.revision));
    let own = |a: &str, b: &str| Some((a.to_string(), b.to_string()));
    assert_eq!(
        p("openai/whisper-tiny.en"),
        own("openai/whisper-tiny.en", "main")
    );
    assert_eq!(
        p("openai/whisper-tiny@v1.0"),
        own("openai/whisper-tiny", "v1.0")
    );
    assert_eq!(p("org/m@refs/pr/3"), own("org/m", "refs/pr/3"));
    for bad in [
        "whisper",
        "a/b/c",
        "/abs/path",
        "./x/y",
        "../x",
        "a/../b",
        "org/",
        "/name",
        "org/na me",
        "org/a--b",
        "org/.hidden",
        "org/m@",
        "org/m@a/../b",
        "org/m@a//b",
    ] {
        assert_eq!(HubId::parse(bad), None, "{bad}");
    }
    assert_eq!(
        HubId::parse("openai/whisper-tiny").unwrap().folder_name(),
        "models--openai--whisper-tiny"
    );

    let dir = tempfile::tempdir().unwrap();
    let env = |vars: &[(&str, &str)]| {
        let m: BTreeMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        HubEnv::from_vars(move |k| m.get(k).cloned()).unwrap()
    };
    let e = env(&[("HOME", "/h")]);
    assert_eq!(e.endpoint, "https://huggingface.co");
    assert!(!e.offline);
    let e = env(&[
        ("HF_HOME", "/hf"),
        ("HF_ENDPOINT", "http://x:1/"),
        ("HF_HUB_OFFLINE", "true"),
        ("HF_TOKEN", " t1 "),
    ]);
    assert_eq!(e.cache_dir, Path::new("/hf/hub"));
    assert_eq!(e.endpoint, "http://x:1");
    assert!(e.offline);
    assert_eq!(e.token.as_deref(), Some("t1"));
    assert_eq!(
        env(&[("HF_HOME", "/hf"), ("HF_HUB_CACHE", "/c")]).cache_dir,
        Path::new("/c")
    );
    assert_eq!(
        env(&[("XDG_CACHE_HOME", "/x")]).cache_dir,
        Path::new("/x/huggingface/hub")
    );
    for (v, off) in [
        ("0", false),
        ("", false),
        ("no", false),
        ("1", true),
        ("ON", true),
    ] {
        assert_eq!(
            env(&[("HF_HOME", "/hf"), ("HF_HUB_OFFLINE", v)]).offline,
            off,
            "{v}"
        );
    }
    // The token `huggingface-cli login` writes, when HF_TOKEN is unset.
    let hf = dir.path().to_str().unwrap();
    std::fs::write(dir.path().join("token"), "t2\n").unwrap();
    assert_eq!(env(&[("HF_HOME", hf)]).token.as_deref(), Some("t2"));
    assert_eq!(
        env(&[("HF_HOME", hf), ("HF_TOKEN", "t3")]).token.as_deref(),
        Some("t3")
    );
}

/// `ckpt` re-written as a sharded checkpoint in `dir`: two safetensors shards and
/// `model.safetensors.index.json`, next to the same json files.
fn shard(ckpt: &Path, dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    for f in [
        "config.json",
        "generation_config.json",
        "preprocessor_config.json",
        "tokenizer.json",
    ] {
        std::fs::copy(ckpt.join(f), dir.join(f)).unwrap();
    }
    let bytes = std::fs::read(ckpt.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut names: Vec<String> = st.names().into_iter().map(str::to_string).collect();
    names.sort();
    let half = names.len() / 2;
    let mut map = serde_json::Map::new();
    for (k, part) in [&names[..half], &names[half..]].into_iter().enumerate() {
        let file = format!("model-{:05}-of-00002.safetensors", k + 1);
        let views: Vec<(String, safetensors::tensor::TensorView)> = part
            .iter()
            .map(|n| (n.clone(), st.tensor(n).unwrap()))
            .collect();
        safetensors::serialize_to_file(views, None, &dir.join(&file)).unwrap();
        for n in part {
            map.insert(n.clone(), file.clone().into());
        }
    }
    let index = serde_json::json!({"metadata": {}, "weight_map": map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
}

#[test]
fn a_sharded_repository_gives_a_whole_models_folder() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    synth(&ckpt);
    let sharded = dir.path().join("sharded");
    shard(&ckpt, &sharded);
    let hub = Hub::serve(&sharded, &[]);
    let home = dir.path().join("hf");
    let ep = hub.endpoint();
    let out = dir.path().join("folder");
    ok(&export_component(
        "all",
        REPO,
        &out,
        &home,
        &[("HF_ENDPOINT", &ep)],
    ));
    for f in [
        "AudioEncoder.mlpackage",
        "TextDecoder.mlpackage",
        "MelSpectrogram.mlpackage",
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "preprocessor_config.json",
    ] {
        assert!(out.join(f).exists(), "{f} missing in the folder");
    }
    // Copied as files, not as links into the cache.
    assert!(!out
        .join("config.json")
        .symlink_metadata()
        .unwrap()
        .is_symlink());
    let snap = repo_dir(&home).join("snapshots").join(COMMIT);
    for f in [
        "model.safetensors.index.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ] {
        assert!(snap.join(f).is_file(), "{f} not in the snapshot");
    }
    assert!(!snap.join("model.safetensors").exists());
    // The encoder equals the one from the unsharded folder.
    let local = dir.path().join("local.mlpackage");
    ok(&export(ckpt.to_str().unwrap(), &local, &home, &[]));
    assert_eq!(
        weights(&out.join("AudioEncoder.mlpackage")),
        weights(&local)
    );
}
