//! `Manifest.json` of an `.mlpackage`: writing it deterministically and reading it without
//! trusting it (every item path must stay inside the package's `Data/` directory).
//!
//! Format (as coremltools' libmodelpackage writes it): a JSON object with
//! `fileFormatVersion` ("1.0.0"), `itemInfoEntries` (identifier → {author, description, name,
//! path}) and `rootModelIdentifier`; item paths are relative to `<package>/Data`. Apple's
//! identifiers are random UUIDs, which would make every build differ; ours are derived from
//! the item path (see [`item_identifier`]) and keys are written sorted with 4-space
//! indentation and a trailing newline — the same shape libmodelpackage produces.

use anyhow::{bail, ensure, Context, Result};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

/// File name of the manifest at the package root.
pub const MANIFEST_FILE: &str = "Manifest.json";
/// Directory (under the package root) that item paths are relative to.
pub const DATA_DIR: &str = "Data";
/// The only manifest format version Core ML defines.
pub const FILE_FORMAT_VERSION: &str = "1.0.0";
/// Author of the model and weights items.
pub const COREML_AUTHOR: &str = "com.apple.CoreML";
/// Item path of the model specification, relative to `Data/`.
pub const MODEL_ITEM_PATH: &str = "com.apple.CoreML/model.mlmodel";
/// Item path of the weights directory, relative to `Data/`.
pub const WEIGHTS_ITEM_PATH: &str = "com.apple.CoreML/weights";
/// Description Core ML uses for the model item.
pub const MODEL_DESCRIPTION: &str = "CoreML Model Specification";
/// Description Core ML uses for the weights item.
pub const WEIGHTS_DESCRIPTION: &str = "CoreML Model Weights";

/// One entry of `itemInfoEntries`. Field order is alphabetical so serialization is sorted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ItemInfo {
    pub author: String,
    pub description: String,
    pub name: String,
    /// Relative to the package's `Data/` directory.
    pub path: String,
}

/// The parsed manifest. `BTreeMap` keeps entries in sorted identifier order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    #[serde(rename = "fileFormatVersion")]
    pub file_format_version: String,
    #[serde(rename = "itemInfoEntries")]
    pub item_info_entries: BTreeMap<String, ItemInfo>,
    #[serde(rename = "rootModelIdentifier")]
    pub root_model_identifier: String,
}

/// Where things are in a package whose manifest has been checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PackageLayout {
    /// The package directory as given.
    pub root: PathBuf,
    /// The root model file (`.../Data/com.apple.CoreML/model.mlmodel`).
    pub model: PathBuf,
    /// The weights directory, when the manifest lists one (mlprograms without weights have
    /// none).
    pub weights_dir: Option<PathBuf>,
}

/// A stable identifier for an item: the first 16 bytes of `sha256("milkit:" + path)` in UUID
/// text form, with the version nibble set to 8 and the RFC 9562 variant bits (a "custom"
/// UUID), lowercase like Apple's. The same path always gets the same identifier.
pub fn item_identifier(path: &str) -> String {
    let digest = Sha256::digest(format!("milkit:{path}").as_bytes());
    let mut b = [0u8; 16];
    b.copy_from_slice(&digest[..16]);
    b[6] = (b[6] & 0x0f) | 0x80;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

impl Manifest {
    /// A manifest with no items and no root model yet.
    pub fn empty() -> Manifest {
        Manifest {
            file_format_version: FILE_FORMAT_VERSION.into(),
            item_info_entries: BTreeMap::new(),
            root_model_identifier: String::new(),
        }
    }

    /// The standard manifest of an mlprogram package: the model specification as the root
    /// model and, when `with_weights`, the weights directory.
    pub fn mlprogram(with_weights: bool) -> Manifest {
        let mut m = Manifest::empty();
        let root = m.add_item(MODEL_ITEM_PATH, MODEL_DESCRIPTION);
        m.root_model_identifier = root;
        if with_weights {
            m.add_item(WEIGHTS_ITEM_PATH, WEIGHTS_DESCRIPTION);
        }
        m
    }

    /// Adds an item authored by Core ML at `path` (relative to `Data/`, `/`-separated; its
    /// name is the last component) and returns its identifier.
    pub fn add_item(&mut self, path: &str, description: &str) -> String {
        let id = item_identifier(path);
        let name = path.rsplit('/').next().unwrap_or(path).to_string();
        self.item_info_entries.insert(
            id.clone(),
            ItemInfo {
                author: COREML_AUTHOR.into(),
                description: description.into(),
                name,
                path: path.into(),
            },
        );
        id
    }

    /// The JSON text: keys sorted, 4-space indentation, trailing newline.
    pub fn to_json(&self) -> Result<String> {
        let mut out = Vec::new();
        let fmt = serde_json::ser::PrettyFormatter::with_indent(b"    ");
        let mut ser = serde_json::Serializer::with_formatter(&mut out, fmt);
        self.serialize(&mut ser)
            .context("cannot serialize Manifest.json")?;
        out.push(b'\n');
        String::from_utf8(out).context("Manifest.json is not UTF-8")
    }

    /// Writes `<package>/Manifest.json`.
    pub fn write(&self, package: &Path) -> Result<()> {
        let path = package.join(MANIFEST_FILE);
        std::fs::write(&path, self.to_json()?)
            .with_context(|| format!("cannot write {}", path.display()))
    }

    /// Parses manifest text; `origin` names the file in errors. Checks the version and that
    /// the root model and every item path are well formed (see [`check_item_path`]).
    pub fn parse(text: &str, origin: &Path) -> Result<Manifest> {
        let m: Manifest = serde_json::from_str(text)
            .with_context(|| format!("{}: not a valid package manifest", origin.display()))?;
        ensure!(
            m.file_format_version == FILE_FORMAT_VERSION,
            "{}: fileFormatVersion {:?} is not supported (expected {FILE_FORMAT_VERSION:?})",
            origin.display(),
            m.file_format_version
        );
        ensure!(
            m.item_info_entries.contains_key(&m.root_model_identifier),
            "{}: rootModelIdentifier {:?} is not among itemInfoEntries",
            origin.display(),
            m.root_model_identifier
        );
        for (id, item) in &m.item_info_entries {
            check_item_path(&item.path)
                .with_context(|| format!("{}: item {id}", origin.display()))?;
        }
        Ok(m)
    }

    /// The entry of the root model.
    pub fn root_item(&self) -> Option<&ItemInfo> {
        self.item_info_entries.get(&self.root_model_identifier)
    }

    /// The first item with this author and name (that is how Core ML finds the weights).
    pub fn find_item(&self, author: &str, name: &str) -> Option<&ItemInfo> {
        self.item_info_entries
            .values()
            .find(|i| i.author == author && i.name == name)
    }
}

/// Rejects item paths that could leave `Data/`: empty, absolute, with a root or drive prefix,
/// with `..`, or with backslashes (which other platforms would treat as separators).
pub fn check_item_path(path: &str) -> Result<()> {
    ensure!(!path.is_empty(), "empty item path");
    ensure!(
        !path.contains('\\'),
        "item path {path:?} contains a backslash"
    );
    ensure!(!path.starts_with('/'), "item path {path:?} is absolute");
    for c in Path::new(path).components() {
        match c {
            Component::Normal(_) | Component::CurDir => {}
            Component::ParentDir => bail!("item path {path:?} contains '..'"),
            Component::RootDir | Component::Prefix(_) => bail!("item path {path:?} is absolute"),
        }
    }
    Ok(())
}

/// Reads `<package>/Manifest.json` and resolves the root model and the weights directory.
/// Each resolved path must exist and, after following symlinks, lie inside `<package>/Data`.
pub fn read_package(package: &Path) -> Result<PackageLayout> {
    let manifest_path = package.join(MANIFEST_FILE);
    let text = std::fs::read_to_string(&manifest_path)
        .with_context(|| format!("cannot read {}", manifest_path.display()))?;
    let manifest = Manifest::parse(&text, &manifest_path)?;
    let data = package.join(DATA_DIR);
    let data_real = data
        .canonicalize()
        .with_context(|| format!("{}: no {DATA_DIR} directory", package.display()))?;
    let root_real = package
        .canonicalize()
        .with_context(|| format!("cannot resolve {}", package.display()))?;
    ensure!(
        data_real.starts_with(&root_real),
        "{}: {DATA_DIR} resolves to {}, outside the package",
        package.display(),
        data_real.display()
    );
    let resolve = |item: &ItemInfo| -> Result<PathBuf> {
        let p = data.join(&item.path);
        let real = p.canonicalize().with_context(|| {
            format!(
                "{}: item {:?} points at {}, which does not exist",
                manifest_path.display(),
                item.name,
                p.display()
            )
        })?;
        ensure!(
            real.starts_with(&data_real),
            "{}: item {:?} resolves to {}, outside the package's {DATA_DIR} directory",
            manifest_path.display(),
            item.name,
            real.display()
        );
        Ok(p)
    };
    let root = manifest.root_item().context("root model entry vanished")?;
    let model = resolve(root)?;
    ensure!(
        model.is_file(),
        "{}: root model {} is not a file",
        manifest_path.display(),
        model.display()
    );
    let weights_dir = match manifest.find_item(COREML_AUTHOR, "weights") {
        Some(item) => {
            let w = resolve(item)?;
            ensure!(
                w.is_dir(),
                "{}: weights item {} is not a directory",
                manifest_path.display(),
                w.display()
            );
            Some(w)
        }
        None => None,
    };
    Ok(PackageLayout {
        root: package.to_path_buf(),
        model,
        weights_dir,
    })
}
