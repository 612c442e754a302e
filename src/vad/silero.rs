//! Silero VAD as a Core ML model (FluidInference's conversions: `silero-vad-unified-v6.0.0`
//! and its int8, palettized and pruned variants), run with milkit's own runtime: one
//! speech probability per [`WINDOW`] samples, as faster-whisper's ONNX Silero gives them.
//!
//! The model's ABI: inputs `audio_input` fp32 `[1, 576]` ([`CONTEXT`] samples of the
//! previous window, then the window), `hidden_state` and `cell_state` fp32 `[1, S]` (the
//! LSTM's state, zeros at the start); outputs `vad_output` (the probability, one element),
//! `new_hidden_state` and `new_cell_state`, fed back for the next window. The recording is
//! padded with zeros to whole windows as faster-whisper pads it ([`super::windows`]), and
//! the first window's context is zeros. Models that take several windows a call and return
//! one aggregate probability (`…-256ms-…`) are refused: the rules need one per window.
//!
//! [`resolve`] finds the model of a `--vad` argument: a folder by path, or a Hugging Face
//! Hub id `ORG/NAME[@REVISION][:FOLDER]` fetched into the Hub cache (`crate::hub`), e.g.
//! `FluidInference/silero-vad-coreml`, whose [`DEFAULT_HUB_FOLDER`] is taken when no
//! folder is named.

use super::{windows, CONTEXT, WINDOW};
use crate::hub::{snapshot_files, HubEnv, HubId};
use crate::ir::{Dim, ValueType};
use crate::runtime::precision::Compute;
use crate::runtime::{Session, Tensor};
use anyhow::{anyhow, bail, ensure, Context, Result};
use std::path::{Path, PathBuf};

const AUDIO: &str = "audio_input";
const HIDDEN: &str = "hidden_state";
const CELL: &str = "cell_state";
const PROB: &str = "vad_output";
const NEW_HIDDEN: &str = "new_hidden_state";
const NEW_CELL: &str = "new_cell_state";

/// The folder of a Hub repository taken when a Hub id names none.
pub const DEFAULT_HUB_FOLDER: &str = "silero-vad-unified-v6.0.0.mlmodelc";

/// A `--vad` argument → a model folder: an existing path as it is; else a Hub id
/// `ORG/NAME[@REVISION][:FOLDER]` (FOLDER a `.mlmodelc` or `.mlpackage` folder of the
/// repository, [`DEFAULT_HUB_FOLDER`] when left out), its files found in or downloaded into
/// the Hub cache (`HF_HUB_OFFLINE=1`: the cache only). `progress`: a bar per download.
pub fn resolve(arg: &str, progress: bool) -> Result<PathBuf> {
    let path = Path::new(arg);
    if path.exists() {
        return Ok(path.to_path_buf());
    }
    let (repo, folder) = match arg.split_once(':') {
        Some((r, f)) => (r, f.trim_matches('/')),
        None => (arg, DEFAULT_HUB_FOLDER),
    };
    let Some(id) = HubId::parse(repo) else {
        bail!(
            "VAD model {arg} does not exist (and is no Hugging Face Hub id \
             ORG/NAME[@REVISION][:FOLDER])"
        );
    };
    ensure!(
        !folder.is_empty()
            && folder
                .split('/')
                .all(|c| !c.is_empty() && c != "." && c != ".."),
        "VAD model {arg}: `{folder}` is not a folder path inside the repository"
    );
    let files: &[(&str, bool)] = if folder.ends_with(".mlmodelc") {
        &[
            ("model.mil", true),
            ("coremldata.bin", true),
            ("metadata.json", false),
            ("analytics/coremldata.bin", false),
            ("weights/weight.bin", false),
        ]
    } else if folder.ends_with(".mlpackage") {
        &[
            ("Manifest.json", true),
            ("Data/com.apple.CoreML/model.mlmodel", true),
            ("Data/com.apple.CoreML/weights/weight.bin", false),
        ]
    } else {
        bail!("VAD model {arg}: `{folder}` is neither a .mlmodelc nor a .mlpackage folder")
    };
    let names: Vec<String> = files.iter().map(|(f, _)| format!("{folder}/{f}")).collect();
    let list: Vec<(&str, bool)> = names
        .iter()
        .zip(files)
        .map(|(n, (_, r))| (n.as_str(), *r))
        .collect();
    let env = HubEnv::from_env()?;
    let root = snapshot_files(&id, &env, &list, progress).with_context(|| {
        format!("no file or folder {arg}, so it was read as a Hugging Face Hub id")
    })?;
    Ok(root.join(folder))
}

/// A loaded Silero VAD model.
pub struct Silero {
    session: Session,
    path: PathBuf,
    /// Elements of the LSTM state.
    state: usize,
}

impl std::fmt::Debug for Silero {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Silero")
            .field("path", &self.path)
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

/// The fixed shape of a tensor input or output, or why it has none.
fn fixed_shape(name: &str, ty: &ValueType) -> Result<Vec<usize>> {
    match ty {
        ValueType::Tensor(t) => t
            .shape
            .iter()
            .map(|d| match d {
                Dim::Fixed(n) => Ok(*n),
                _ => bail!("`{name}` has a flexible shape {t}"),
            })
            .collect(),
        o => bail!("`{name}` is {o}, not a tensor"),
    }
}

impl Silero {
    /// Loads a `.mlpackage` or compiled `.mlmodelc` folder and checks its ABI (see the
    /// module doc); errors name the file and what does not fit.
    pub fn load(path: &Path) -> Result<Silero> {
        Silero::load_with(path, Compute::default())
    }

    /// [`Silero::load`] computing at `compute` precision (`Package`: the model's own fp16,
    /// as a device computes it; `Fp32`: widened, closer to the float32 ONNX model).
    pub fn load_with(path: &Path, compute: Compute) -> Result<Silero> {
        ensure!(
            path.exists(),
            "VAD model {} does not exist (expected a .mlpackage or .mlmodelc folder)",
            path.display()
        );
        let opts = crate::runtime::Options {
            compute,
            ..Default::default()
        };
        let session = Session::load_with(path, &opts)
            .with_context(|| format!("loading VAD model {}", path.display()))?;
        Silero::new(session, path)
            .with_context(|| format!("{}: not a usable Silero VAD model", path.display()))
    }

    fn new(mut session: Session, path: &Path) -> Result<Silero> {
        // One window a call: comparing inputs to memoize would only cost time.
        session.set_memoize(false);
        let ins = session.inputs(None)?;
        let outs = session.outputs(None)?;
        let find = |list: &[(String, ValueType)], name: &str, what: &str| {
            list.iter()
                .find(|(n, _)| n == name)
                .map(|(n, t)| fixed_shape(n, t))
                .ok_or_else(|| {
                    anyhow!(
                        "no {what} `{name}` (it has {})",
                        list.iter()
                            .map(|(n, _)| format!("`{n}`"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                })?
        };
        let audio = find(&ins, AUDIO, "input")?;
        let n: usize = audio.iter().product();
        ensure!(
            n == WINDOW + CONTEXT,
            "input `{AUDIO}` {audio:?} holds {n} samples a call; one speech probability per \
             {WINDOW}-sample window needs {} ({CONTEXT} of context, then the window)",
            WINDOW + CONTEXT
        );
        let hidden = find(&ins, HIDDEN, "input")?;
        let cell = find(&ins, CELL, "input")?;
        let state: usize = hidden.iter().product();
        ensure!(
            cell.iter().product::<usize>() == state && state > 0,
            "inputs `{HIDDEN}` {hidden:?} and `{CELL}` {cell:?} differ"
        );
        let prob = find(&outs, PROB, "output")?;
        ensure!(
            prob.iter().product::<usize>() == 1,
            "output `{PROB}` {prob:?} is not one probability"
        );
        for name in [NEW_HIDDEN, NEW_CELL] {
            let s = find(&outs, name, "output")?;
            ensure!(
                s.iter().product::<usize>() == state,
                "output `{name}` {s:?} does not fit the {state}-element state"
            );
        }
        Ok(Silero {
            session,
            path: path.to_path_buf(),
            state,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// One speech probability per [`WINDOW`] samples of 16 kHz mono `samples`
    /// ([`super::windows`] of them), the state carried from window to window.
    pub fn probabilities(&mut self, samples: &[f32]) -> Result<Vec<f32>> {
        let n = windows(samples.len());
        let mut padded = samples.to_vec();
        padded.resize(n * WINDOW, 0.0);
        let cpu = candle_core::Device::Cpu;
        let mut hidden = Tensor::zeros((1, self.state), candle_core::DType::F32, &cpu)?;
        let mut cell = hidden.clone();
        let mut out = Vec::with_capacity(n);
        let mut input = vec![0f32; CONTEXT + WINDOW];
        for i in 0..n {
            let from = i * WINDOW;
            if i == 0 {
                input[..CONTEXT].fill(0.0);
            } else {
                input[..CONTEXT].copy_from_slice(&padded[from - CONTEXT..from]);
            }
            input[CONTEXT..].copy_from_slice(&padded[from..from + WINDOW]);
            let x = Tensor::from_slice(&input, (1, CONTEXT + WINDOW), &cpu)?;
            let res = self
                .session
                .predict(&[(AUDIO, x), (HIDDEN, hidden.clone()), (CELL, cell.clone())])
                .with_context(|| {
                    format!(
                        "running VAD model {} on window {i} ({:.3} s)",
                        self.path.display(),
                        from as f64 / super::SAMPLE_RATE as f64
                    )
                })?;
            let get = |name: &str| {
                res.iter()
                    .find(|(k, _)| k == name)
                    .map(|(_, v)| v.clone())
                    .ok_or_else(|| anyhow!("{}: no output `{name}`", self.path.display()))
            };
            let p = get(PROB)?
                .to_dtype(candle_core::DType::F32)?
                .flatten_all()?
                .to_vec1::<f32>()?;
            ensure!(
                p.len() == 1 && p[0].is_finite(),
                "{}: window {i} gave the probability {p:?}",
                self.path.display()
            );
            out.push(p[0]);
            hidden = get(NEW_HIDDEN)?
                .to_dtype(candle_core::DType::F32)?
                .reshape((1, self.state))?;
            cell = get(NEW_CELL)?
                .to_dtype(candle_core::DType::F32)?
                .reshape((1, self.state))?;
        }
        Ok(out)
    }
}
