//! `milkit run`: predictions of any package with the bundled runtime, tensors in from
//! `.npy` / `.safetensors:NAME` files, out as `.npy` files named after the outputs (a
//! classifier's string label and class → probability dictionary as `.json`). A
//! stateful package keeps one state per package (zeros, as Core ML's `makeState()`, or the
//! `--state` files) across the `--repeat` predictions; `--save-states` writes the final ones.

use anyhow::{bail, ensure, Context, Result};
use candle_core::Tensor;
use clap::Args;
use milkit::runtime::{io, DictKeys, Output, Session};
use std::path::PathBuf;

#[derive(Args)]
pub struct RunArgs {
    /// The `.mlpackage` to run.
    pub package: PathBuf,
    /// An input as NAME=FILE, where FILE is `x.npy` or `x.safetensors:TENSOR`; repeat for each
    /// input. Data is converted at the boundary as Core ML does (fp32 data for an fp16 input,
    /// int32 for an fp16 mask); shapes must match. Several files for one input are taken in
    /// turn by --repeat's predictions (prediction k reads the (k mod n)-th).
    #[arg(long = "input", value_name = "NAME=FILE")]
    pub inputs: Vec<String>,
    /// Output directory; each output is written as DIR/NAME.npy in the package's output dtype;
    /// a classifier's dictionary as DIR/NAME.json (an object class → probability, in class
    /// order; int64 classes as decimal keys) and a string label as DIR/NAME.json (a JSON
    /// string; an int64 label is an .npy scalar).
    #[arg(long)]
    pub out: PathBuf,
    /// Function of a multifunction package (default: the package's default function,
    /// else main).
    #[arg(long)]
    pub function: Option<String>,
    /// Number of predictions, sharing the package's states, all with the same inputs (or
    /// each input's files in turn); with N > 1 prediction k's outputs are written as
    /// DIR/NAME.k.npy (or .k.json).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub repeat: u32,
    /// A state's initial value as NAME=FILE (default: zeros, as Core ML's makeState()).
    #[arg(long = "state", value_name = "NAME=FILE")]
    pub states: Vec<String>,
    /// After the last prediction, write every state as DIR/states/NAME.npy.
    #[arg(long)]
    pub save_states: bool,
    /// Print nothing on success.
    #[arg(long)]
    pub quiet: bool,
    /// Refuse to run a package whose constants plus the values live at once would take more
    /// memory than this: bytes, or with a K/M/G/T suffix (powers of 1024), e.g. `4G`.
    /// Default: the machine's physical memory.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub max_memory: Option<u64>,
    /// Seed of the random stream the random ops (`random_normal`, ...) without a `seed` of
    /// their own draw from; the same seed gives the same outputs.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Stop a `while_loop` that runs more iterations than this, with an error naming it.
    #[arg(long, default_value_t = milkit::runtime::DEFAULT_MAX_LOOP_ITERATIONS)]
    pub max_loop_iterations: u64,
    /// Precision the package is computed in. `package`: its own types, as a device computes
    /// them. `fp32`: every fp16 tensor widened to float32 (to compare with float32
    /// references; not what a device computes). `bf16`: its own types, the encoder-sized
    /// 1x1 convs and self-attention on bfloat16-rounded inputs with float32 sums — a faster
    /// evaluation mode, less exact, not what a device computes; needs a CPU with AVX512-BF16.
    #[arg(long, value_enum, default_value = "package")]
    pub compute: milkit::runtime::precision::Compute,
    /// Print to stderr where the time went: the load (parse, fold and pack the weights),
    /// each prediction, and per op type the calls and time summed over the predictions.
    #[arg(long)]
    pub profile: bool,
    /// Compute every op on every prediction: by default a value that depends only on inputs
    /// fed unchanged since the previous prediction is reused (a decoder's projection of the
    /// encoder output). For timing a model's full work with --repeat.
    #[arg(long)]
    pub no_memo: bool,
}

/// `4096`, `512K`, `64M`, `4G`, `1T` (powers of 1024; `iB`/`B` suffixes allowed).
fn parse_size(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    let t = t
        .strip_suffix("iB")
        .or_else(|| t.strip_suffix('B'))
        .unwrap_or(t);
    let (digits, shift) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => (
            &t[..i],
            match c.to_ascii_uppercase() {
                'K' => 10,
                'M' => 20,
                'G' => 30,
                'T' => 40,
                _ => {
                    return Err(format!(
                        "`{s}`: unknown size suffix `{c}` (use K, M, G or T)"
                    ))
                }
            },
        ),
        _ => (t, 0),
    };
    let n: u64 = digits
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a size (e.g. 4096, 512M, 4G)"))?;
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("`{s}` is too large"))
}

/// `NAME=FILE` → (name, file spec).
fn parse_input(s: &str) -> Result<(&str, &str)> {
    parse_spec("--input", s)
}

fn parse_spec<'a>(flag: &str, s: &'a str) -> Result<(&'a str, &'a str)> {
    match s.split_once('=') {
        Some((n, f)) if !n.is_empty() && !f.is_empty() => Ok((n, f)),
        _ => bail!("{flag} `{s}`: expected NAME=FILE (FILE is x.npy or x.safetensors:TENSOR)"),
    }
}

/// An output name as a file name: path separators and other awkward characters become `_`.
fn file_name(output: &str) -> String {
    output
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

pub fn run(a: &RunArgs) -> Result<u8> {
    let opts = milkit::runtime::Options {
        max_memory: Some(
            a.max_memory
                .unwrap_or_else(milkit::runtime::default_max_memory),
        ),
        seed: a.seed,
        max_loop_iterations: a.max_loop_iterations,
        compute: a.compute,
        ..Default::default()
    };
    let t_load = std::time::Instant::now();
    let mut session = Session::load_with(&a.package, &opts)
        .with_context(|| format!("cannot load {}", a.package.display()))?;
    let load = t_load.elapsed();
    session.enable_profiling(a.profile);
    if a.no_memo {
        session.set_memoize(false);
    }
    let mut predicted = vec![];
    let fname = a.function.as_deref();
    let expected = session.inputs(fname)?;
    let mut feeds = Vec::new();
    for spec in &a.inputs {
        let (name, file) = parse_input(spec)?;
        ensure!(
            expected.iter().any(|(n, _)| n == name),
            "--input {name}: {} has no input `{name}` (inputs: {})",
            a.package.display(),
            expected
                .iter()
                .map(|(n, t)| format!("{n} {t}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        let t = io::read_tensor(file).with_context(|| format!("input `{name}` from {file}"))?;
        feeds.push((name.to_string(), file.to_string(), t));
    }
    for (n, t) in &expected {
        ensure!(
            feeds.iter().any(|(f, _, _)| f == n),
            "missing --input {n}=FILE ({t})"
        );
    }
    for spec in &a.states {
        let (name, file) = parse_spec("--state", spec)?;
        let names = session.state_names();
        ensure!(
            names.contains(&name),
            "--state {name}: {} has no state `{name}` (states: {})",
            a.package.display(),
            if names.is_empty() {
                "none".to_string()
            } else {
                names.join(", ")
            }
        );
        let t = io::read_tensor(file).with_context(|| format!("state `{name}` from {file}"))?;
        session
            .set_state(name, t)
            .with_context(|| format!("state `{name}` from {file}"))?;
    }
    // Each input's files, in the order given: prediction k takes the (k mod n)-th.
    let mut turns: Vec<(&str, Vec<(&str, &Tensor)>)> = Vec::new();
    for (n, f, t) in &feeds {
        match turns.iter_mut().find(|(m, _)| m == n) {
            Some((_, files)) => files.push((f.as_str(), t)),
            None => turns.push((n.as_str(), vec![(f.as_str(), t)])),
        }
    }
    for k in 0..a.repeat {
        let this: Vec<(&str, &str, &Tensor)> = turns
            .iter()
            .map(|(n, files)| {
                let (f, t) = files[k as usize % files.len()];
                (*n, f, t)
            })
            .collect();
        let named: Vec<(&str, Tensor)> = this.iter().map(|(n, _, t)| (*n, (*t).clone())).collect();
        let t_run = std::time::Instant::now();
        let outs = session.predict_values(fname, &named).map_err(|e| {
            // Name the file behind an input the runtime rejected.
            let msg = format!("{e:#}");
            let e = match this
                .iter()
                .find(|(n, _, _)| msg.contains(&format!("input `{n}`")))
            {
                Some((n, f, _)) => e.context(format!("input `{n}` from {f}")),
                None => e,
            };
            if a.repeat > 1 {
                e.context(format!("prediction {k} of {}", a.repeat))
            } else {
                e
            }
        })?;
        predicted.push(t_run.elapsed());
        // Created only once a prediction succeeded: nothing is written on failure.
        std::fs::create_dir_all(&a.out)
            .with_context(|| format!("cannot create {}", a.out.display()))?;
        for (name, v) in outs {
            let ext = match v {
                Output::Tensor(_) => "npy",
                Output::Strings(_) | Output::Dict(_) => "json",
            };
            let file = match a.repeat {
                1 => format!("{}.{ext}", file_name(&name)),
                _ => format!("{}.{k}.{ext}", file_name(&name)),
            };
            let path = a.out.join(file);
            let what = match &v {
                Output::Tensor(t) => {
                    io::write_npy(&path, t).with_context(|| format!("output `{name}`"))?;
                    format!("{:?} {:?}", t.dtype(), t.dims())
                }
                Output::Strings(s) => {
                    write_text(&path, &strings_json(s)?, &name)?;
                    format!("{} string(s)", s.len())
                }
                Output::Dict(d) => {
                    write_text(&path, &dict_json(d)?, &name)?;
                    format!("dictionary of {} classes", d.keys.len())
                }
            };
            if !a.quiet {
                eprintln!("{name}: {what} → {}", path.display());
            }
        }
    }
    if a.profile {
        print_profile(&session, load, &predicted);
    }
    if a.save_states {
        let dir = a.out.join("states");
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        for name in session.state_names() {
            let t = session
                .state(name)
                .ok_or_else(|| anyhow::anyhow!("state `{name}` vanished"))?;
            let path = dir.join(format!("{}.npy", file_name(name)));
            io::write_npy(&path, &t).with_context(|| format!("state `{name}`"))?;
            if !a.quiet {
                eprintln!(
                    "state {name}: {:?} {:?} → {}",
                    t.dtype(),
                    t.dims(),
                    path.display()
                );
            }
        }
    }
    Ok(0)
}

/// `--profile`'s table (stderr, so that stdout stays clean): the load, each prediction, then
/// every op type with its calls, time and share of the predictions' time, slowest first.
fn print_profile(session: &Session, load: std::time::Duration, runs: &[std::time::Duration]) {
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    eprintln!("load: {:.1} ms", ms(load));
    for (k, d) in runs.iter().enumerate() {
        eprintln!("prediction {k}: {:.1} ms", ms(*d));
    }
    let total: f64 = runs.iter().map(|d| ms(*d)).sum::<f64>().max(1e-9);
    eprintln!("| op | calls | ms | share of the predictions |");
    eprintln!("|---|---|---|---|");
    for (op, n, d) in session.profile() {
        eprintln!(
            "| {op} | {n} | {:.1} | {:.1} % |",
            ms(d),
            100.0 * ms(d) / total
        );
    }
}

fn write_text(path: &std::path::Path, text: &str, output: &str) -> Result<()> {
    std::fs::write(path, text)
        .with_context(|| format!("output `{output}`: cannot write {}", path.display()))
}

/// One string as a JSON string; several (a string tensor, flattened) as an array.
fn strings_json(s: &[String]) -> Result<String> {
    Ok(match s {
        [one] => serde_json::to_string(one)?,
        many => serde_json::to_string(many)?,
    } + "\n")
}

/// A dictionary as a JSON object in key order: keys as strings (int64 keys in decimal),
/// fp64 values as JSON numbers (shortest round-trip form; NaN and infinities as null).
fn dict_json(d: &milkit::runtime::DictVal) -> Result<String> {
    let values: Vec<f64> = d.values.to_dtype(milkit::runtime::DType::F64)?.to_vec1()?;
    let keys: Vec<String> = match &d.keys {
        DictKeys::Str(k) => k.clone(),
        DictKeys::Int64(k) => k.iter().map(|x| x.to_string()).collect(),
    };
    ensure!(
        keys.len() == values.len(),
        "a dictionary of {} keys and {} values",
        keys.len(),
        values.len()
    );
    let mut out = String::from("{");
    for (i, (k, v)) in keys.iter().zip(values).enumerate() {
        let sep = if i == 0 { "\n  " } else { ",\n  " };
        out += &format!(
            "{sep}{}: {}",
            serde_json::to_string(k)?,
            serde_json::to_string(&v)?
        );
    }
    out += "\n}\n";
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_specs_and_file_names() {
        assert_eq!(parse_input("x=a.npy").unwrap(), ("x", "a.npy"));
        assert_eq!(
            parse_input("x=f.safetensors:a=b").unwrap(),
            ("x", "f.safetensors:a=b")
        );
        assert!(parse_input("x").is_err());
        assert!(parse_input("=a.npy").is_err());
        assert!(parse_input("x=").is_err());
        assert_eq!(file_name("a/b:c"), "a_b_c");
        assert_eq!(file_name("logits"), "logits");
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("4GiB"), Ok(4 << 30));
        assert_eq!(parse_size("1t"), Ok(1 << 40));
        assert!(parse_size("4X").is_err() && parse_size("G").is_err());
        assert!(parse_size("99999999999T").is_err());
    }

    #[test]
    fn a_dictionary_and_a_label_are_written_as_json() {
        let d = milkit::runtime::DictVal {
            keys: DictKeys::Int64(vec![7, -2]),
            values: milkit::runtime::Tensor::new(&[0.25f64, f64::NAN], &candle_core::Device::Cpu)
                .unwrap(),
        };
        let v: serde_json::Value = serde_json::from_str(&dict_json(&d).unwrap()).unwrap();
        assert_eq!(v, serde_json::json!({"7": 0.25, "-2": null}));
        let s = strings_json(&["a \"b\"".to_string()]).unwrap();
        assert_eq!(serde_json::from_str::<String>(&s).unwrap(), "a \"b\"");
    }
}
