//! `milkit run`: one prediction of any package with the bundled runtime, tensors in from
//! `.npy` / `.safetensors:NAME` files, out as `.npy` files named after the outputs.

use anyhow::{bail, ensure, Context, Result};
use clap::Args;
use milkit::runtime::{io, Session};
use std::path::PathBuf;

#[derive(Args)]
pub struct RunArgs {
    /// The `.mlpackage` to run.
    pub package: PathBuf,
    /// An input as NAME=FILE, where FILE is `x.npy` or `x.safetensors:TENSOR`; repeat for each
    /// input. Data is converted at the boundary as Core ML does (fp32 data for an fp16 input,
    /// int32 for an fp16 mask); shapes must match.
    #[arg(long = "input", value_name = "NAME=FILE")]
    pub inputs: Vec<String>,
    /// Output directory; each output is written as DIR/NAME.npy in the package's output dtype.
    #[arg(long)]
    pub out: PathBuf,
    /// Function of a multifunction package (default: main).
    #[arg(long)]
    pub function: Option<String>,
    /// Print nothing on success.
    #[arg(long)]
    pub quiet: bool,
    /// Refuse to run a package whose constants plus the values live at once would take more
    /// memory than this: bytes, or with a K/M/G/T suffix (powers of 1024), e.g. `4G`.
    /// Default: the machine's physical memory.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub max_memory: Option<u64>,
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
    match s.split_once('=') {
        Some((n, f)) if !n.is_empty() && !f.is_empty() => Ok((n, f)),
        _ => bail!("--input `{s}`: expected NAME=FILE (FILE is x.npy or x.safetensors:TENSOR)"),
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
        ..Default::default()
    };
    let mut session = Session::load_with(&a.package, &opts)?;
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
    let named: Vec<(&str, _)> = feeds
        .iter()
        .map(|(n, _, t)| (n.as_str(), t.clone()))
        .collect();
    let outs = session.predict_function(fname, &named).map_err(|e| {
        // Name the file behind an input the runtime rejected.
        let msg = format!("{e:#}");
        match feeds
            .iter()
            .find(|(n, _, _)| msg.contains(&format!("input `{n}`")))
        {
            Some((n, f, _)) => e.context(format!("input `{n}` from {f}")),
            None => e,
        }
    })?;
    std::fs::create_dir_all(&a.out)
        .with_context(|| format!("cannot create {}", a.out.display()))?;
    for (name, t) in outs {
        let path = a.out.join(format!("{}.npy", file_name(&name)));
        io::write_npy(&path, &t).with_context(|| format!("output `{name}`"))?;
        if !a.quiet {
            eprintln!(
                "{name}: {:?} {:?} → {}",
                t.dtype(),
                t.dims(),
                path.display()
            );
        }
    }
    Ok(0)
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
}
