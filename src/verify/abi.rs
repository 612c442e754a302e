//! I/O ABI checks against the interfaces whisper.cpp and WhisperKit load: feature names,
//! dtypes and shapes of the model description (what Core ML exposes to the app). Model sizes
//! (mel bins, width, layers, vocabulary) are free but must be consistent across features.

use crate::ir::{ArrayDType, Description, Feature};
use crate::report::AbiReport;
use std::collections::BTreeMap;

/// Which runtime's interface a package must present.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum AbiKind {
    /// whisper.cpp's Core ML encoder.
    #[value(name = "whispercpp")]
    WhisperCpp,
    /// WhisperKit's AudioEncoder or TextDecoder (told apart by their input names).
    #[value(name = "whisperkit")]
    WhisperKit,
}

impl AbiKind {
    pub fn name(self) -> &'static str {
        match self {
            AbiKind::WhisperCpp => "whispercpp",
            AbiKind::WhisperKit => "whisperkit",
        }
    }
}

/// Audio frames of a 30 s window (whisper's mel input length).
pub const MEL_FRAMES: usize = 3000;
/// Encoder positions (frames after the stride-2 stem).
pub const AUDIO_CTX: usize = 1500;
/// WhisperKit's decoder KV-cache length (whisper's text context).
pub const TEXT_CTX: usize = 448;

/// One expected feature: name, dtype, and a shape where `None` is a free size to be read into
/// the named dimension (and must agree with any earlier reading of it).
#[derive(Clone)]
struct Want<'a> {
    name: &'a str,
    dtype: ArrayDType,
    shape: Vec<Dim<'a>>,
}

#[derive(Clone, Copy)]
enum Dim<'a> {
    Is(usize),
    Var(&'a str),
}

fn dt(d: ArrayDType) -> &'static str {
    d.to_dtype().name()
}

struct Checker {
    problems: Vec<String>,
    dims: BTreeMap<String, u64>,
}

impl Checker {
    fn feature(&mut self, kind: &str, list: &[Feature], want: &Want) {
        let Some(f) = list.iter().find(|f| f.name == want.name) else {
            self.problems
                .push(format!("missing {kind} `{}`", want.name));
            return;
        };
        if f.dtype != want.dtype {
            self.problems.push(format!(
                "{kind} `{}` is {}, expected {}",
                f.name,
                dt(f.dtype),
                dt(want.dtype)
            ));
        }
        let expect: Vec<String> = want
            .shape
            .iter()
            .map(|d| match d {
                Dim::Is(n) => n.to_string(),
                Dim::Var(v) => v.to_string(),
            })
            .collect();
        if f.shape.len() != want.shape.len() {
            self.problems.push(format!(
                "{kind} `{}` has shape {:?}, expected [{}]",
                f.name,
                f.shape,
                expect.join(", ")
            ));
            return;
        }
        for (i, (&got, d)) in f.shape.iter().zip(&want.shape).enumerate() {
            match *d {
                Dim::Is(n) if got != n => self.problems.push(format!(
                    "{kind} `{}` has shape {:?}, expected [{}] (axis {i} is {got}, not {n})",
                    f.name,
                    f.shape,
                    expect.join(", ")
                )),
                Dim::Is(_) => {}
                Dim::Var(v) => match self.dims.get(v) {
                    Some(&prev) if prev != got as u64 => self.problems.push(format!(
                        "{kind} `{}` has {v} = {got} on axis {i}, but another feature has {v} = {prev}",
                        f.name
                    )),
                    Some(_) => {}
                    None => {
                        if got == 0 {
                            self.problems.push(format!("{kind} `{}` has a zero {v}", f.name));
                        }
                        self.dims.insert(v.to_string(), got as u64);
                    }
                },
            }
        }
    }

    /// Features beyond the expected ones break loaders that bind every input by name.
    fn no_extra(&mut self, kind: &str, list: &[Feature], wants: &[Want]) {
        for f in list {
            if !wants.iter().any(|w| w.name == f.name) {
                self.problems
                    .push(format!("unexpected {kind} `{}`", f.name));
            }
        }
    }

    /// Every `inputs` and `outputs` feature, as wanted, and nothing else but the `optional`
    /// outputs, which are checked when present.
    fn all(&mut self, d: &Description, inputs: &[Want], outputs: &[Want], optional: &[Want]) {
        for w in inputs {
            self.feature("input", &d.inputs, w);
        }
        for w in outputs {
            self.feature("output", &d.outputs, w);
        }
        for w in optional {
            if d.outputs.iter().any(|f| f.name == w.name) {
                self.feature("output", &d.outputs, w);
            }
        }
        self.no_extra("input", &d.inputs, inputs);
        let allowed: Vec<Want> = outputs.iter().chain(optional).cloned().collect();
        self.no_extra("output", &d.outputs, &allowed);
        for s in &d.states {
            self.problems.push(format!(
                "unexpected state `{}` (this ABI passes no states)",
                s.name
            ));
        }
    }
}

fn w<'a>(name: &'a str, dtype: ArrayDType, shape: &[Dim<'a>]) -> Want<'a> {
    Want {
        name,
        dtype,
        shape: shape.to_vec(),
    }
}

use ArrayDType::{F16, F32, I32};
use Dim::{Is, Var};

/// Checks a model description against an ABI.
pub fn check_abi(d: &Description, kind: AbiKind) -> AbiReport {
    let mut c = Checker {
        problems: Vec::new(),
        dims: BTreeMap::new(),
    };
    let has = |n: &str| d.inputs.iter().any(|f| f.name == n);
    let component = match kind {
        AbiKind::WhisperCpp => {
            c.all(
                d,
                &[w(
                    "logmel_data",
                    F32,
                    &[Is(1), Var("n_mels"), Is(MEL_FRAMES)],
                )],
                &[w("output", F32, &[Is(1), Is(AUDIO_CTX), Var("d_model")])],
                &[],
            );
            Some("encoder")
        }
        AbiKind::WhisperKit if has("melspectrogram_features") => {
            c.all(
                d,
                &[w(
                    "melspectrogram_features",
                    F16,
                    &[Is(1), Var("n_mels"), Is(1), Is(MEL_FRAMES)],
                )],
                &[w(
                    "encoder_output_embeds",
                    F16,
                    &[Is(1), Var("d_model"), Is(1), Is(AUDIO_CTX)],
                )],
                &[],
            );
            Some("encoder")
        }
        AbiKind::WhisperKit if has("input_ids") => {
            let kv = [Is(1), Var("kv_width"), Is(1), Is(TEXT_CTX)];
            let upd = [Is(1), Var("kv_width"), Is(1), Is(1)];
            c.all(
                d,
                &[
                    w("input_ids", I32, &[Is(1)]),
                    w("cache_length", I32, &[Is(1)]),
                    w("key_cache", F16, &kv),
                    w("value_cache", F16, &kv),
                    w("kv_cache_update_mask", F16, &[Is(1), Is(TEXT_CTX)]),
                    w(
                        "encoder_output_embeds",
                        F16,
                        &[Is(1), Var("d_model"), Is(1), Is(AUDIO_CTX)],
                    ),
                    w("decoder_key_padding_mask", F16, &[Is(1), Is(TEXT_CTX)]),
                ],
                &[
                    w("logits", F16, &[Is(1), Is(1), Var("vocab")]),
                    w("key_cache_updates", F16, &upd),
                    w("value_cache_updates", F16, &upd),
                    w("alignment_heads_weights", F16, &[Is(1), Is(AUDIO_CTX)]),
                ],
                // milkit's per-head alignment output (on by default with `export --component
                // all`): WhisperKit reads outputs by name, so an extra output does not
                // disturb it.
                &[w(
                    "alignment_heads_weights_per_head",
                    F16,
                    &[Is(1), Var("alignment_heads"), Is(AUDIO_CTX)],
                )],
            );
            // The cache stacks every layer's keys: its width is d_model × layers.
            if let (Some(&kvw), Some(&dm)) = (c.dims.get("kv_width"), c.dims.get("d_model")) {
                if dm > 0 && kvw % dm == 0 {
                    c.dims.insert("layers".into(), kvw / dm);
                } else {
                    c.problems.push(format!(
                        "KV cache width {kvw} is not a multiple of d_model {dm}"
                    ));
                }
            }
            Some("decoder")
        }
        AbiKind::WhisperKit => {
            let names: Vec<&str> = d.inputs.iter().map(|f| f.name.as_str()).collect();
            c.problems.push(format!(
                "inputs {names:?} are neither WhisperKit's encoder (`melspectrogram_features`) nor its decoder (`input_ids`, ...)"
            ));
            None
        }
    };
    AbiReport {
        expected: kind.name().to_string(),
        component: component.map(str::to_string),
        ok: c.problems.is_empty(),
        problems: c.problems,
        dims: c.dims,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(n: &str, d: ArrayDType, s: &[usize]) -> Feature {
        Feature::new(n, d, s)
    }

    fn decoder(d: usize, layers: usize, vocab: usize) -> Description {
        let kv = d * layers;
        Description {
            inputs: vec![
                f("input_ids", I32, &[1]),
                f("cache_length", I32, &[1]),
                f("key_cache", F16, &[1, kv, 1, 448]),
                f("value_cache", F16, &[1, kv, 1, 448]),
                f("kv_cache_update_mask", F16, &[1, 448]),
                f("encoder_output_embeds", F16, &[1, d, 1, 1500]),
                f("decoder_key_padding_mask", F16, &[1, 448]),
            ],
            outputs: vec![
                f("logits", F16, &[1, 1, vocab]),
                f("key_cache_updates", F16, &[1, kv, 1, 1]),
                f("value_cache_updates", F16, &[1, kv, 1, 1]),
                f("alignment_heads_weights", F16, &[1, 1500]),
            ],
            ..Default::default()
        }
    }

    #[test]
    fn whisperkit_decoder_passes_and_reads_dims() {
        let r = check_abi(&decoder(384, 4, 51864), AbiKind::WhisperKit);
        assert!(r.ok, "{:?}", r.problems);
        assert_eq!(r.component.as_deref(), Some("decoder"));
        assert_eq!(r.dims["layers"], 4);
        assert_eq!(r.dims["vocab"], 51864);
        assert_eq!(r.dims["d_model"], 384);
    }

    #[test]
    fn the_per_head_alignment_output_is_allowed_and_checked_but_nothing_else_extra() {
        let mut d = decoder(384, 4, 51864);
        d.outputs
            .push(f("alignment_heads_weights_per_head", F16, &[1, 6, 1500]));
        let r = check_abi(&d, AbiKind::WhisperKit);
        assert!(r.ok, "{:?}", r.problems);
        assert_eq!(r.dims["alignment_heads"], 6);
        d.outputs[4].shape = vec![1, 6, 1499];
        let r = check_abi(&d, AbiKind::WhisperKit);
        assert!(!r.ok);
        assert!(
            r.problems[0].contains("alignment_heads_weights_per_head"),
            "{:?}",
            r.problems
        );
        d.outputs[4] = f("debug_probe", F16, &[1]);
        let r = check_abi(&d, AbiKind::WhisperKit);
        assert_eq!(r.problems, ["unexpected output `debug_probe`"]);
    }

    #[test]
    fn whisperkit_decoder_mismatches_are_named() {
        let mut d = decoder(384, 4, 51864);
        d.outputs[1].shape = vec![1, 384 * 3, 1, 1];
        d.inputs[0].dtype = F16;
        let r = check_abi(&d, AbiKind::WhisperKit);
        assert!(!r.ok);
        let all = r.problems.join("\n");
        assert!(
            all.contains("input `input_ids` is fp16, expected int32"),
            "{all}"
        );
        assert!(all.contains("key_cache_updates"), "{all}");
        // A whisper.cpp check of a decoder fails on every feature.
        let r = check_abi(&decoder(384, 4, 51864), AbiKind::WhisperCpp);
        assert!(r
            .problems
            .iter()
            .any(|p| p.contains("missing input `logmel_data`")));
    }

    #[test]
    fn encoders() {
        let cpp = Description {
            inputs: vec![f("logmel_data", F32, &[1, 80, 3000])],
            outputs: vec![f("output", F32, &[1, 1500, 384])],
            ..Default::default()
        };
        assert!(check_abi(&cpp, AbiKind::WhisperCpp).ok);
        let r = check_abi(&cpp, AbiKind::WhisperKit);
        assert!(!r.ok && r.component.is_none());
        let kit = Description {
            inputs: vec![f("melspectrogram_features", F16, &[1, 128, 1, 3000])],
            outputs: vec![f("encoder_output_embeds", F16, &[1, 1280, 1, 1499])],
            ..Default::default()
        };
        let r = check_abi(&kit, AbiKind::WhisperKit);
        assert!(!r.ok);
        assert!(
            r.problems[0].contains("axis 3 is 1499, not 1500"),
            "{:?}",
            r.problems
        );
    }
}
