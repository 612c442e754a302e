//! `milkit bench whole AUDIO --models DIR [--faster-whisper PYTHON]`: whole process against
//! whole process. Each run spawns `milkit transcribe` (this binary) and, when asked,
//! `tools/faster_whisper_bench.py` on the same audio with the same decoding (greedy or the
//! same number of beams, one temperature, no timestamps, the language forced), alternating,
//! and takes each child's wall time from spawn to exit and its peak resident set from the
//! kernel (`wait4`'s `ru_maxrss`). Loading, imports and page-ins count, as they do for a
//! user; one untimed warm-up pair comes first so both read warm files.

use anyhow::{bail, Context, Result};
use milkit::report::{WholeBenchReport, WholeSide};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use super::stats::median;

/// What to run and how often.
pub struct WholeOpts<'a> {
    pub audio: &'a Path,
    pub models: &'a Path,
    pub runs: usize,
    pub threads: usize,
    pub language: &'a str,
    /// 1: greedy; more: beam search with this many beams on both sides.
    pub beam_size: usize,
    pub python: Option<&'a Path>,
    /// Hugging Face checkpoint faster-whisper converts (the script's default when None).
    pub checkpoint: Option<&'a Path>,
    pub compute_type: &'a str,
    pub json: bool,
}

/// One finished child: wall ms, peak RSS in MB, stdout.
struct Finished {
    wall_ms: f64,
    rss_mb: f64,
    stdout: String,
}

/// Spawns `cmd`, reads its output, reaps it with `wait4` for its own resource usage.
fn run_measured(cmd: &[String], threads: usize) -> Result<Finished> {
    let t0 = Instant::now();
    let mut child = Command::new(&cmd[0])
        .args(&cmd[1..])
        .env("RAYON_NUM_THREADS", threads.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot start {}", cmd[0]))?;
    let mut err_pipe = child.stderr.take().expect("stderr is piped");
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err_pipe.read_to_string(&mut s);
        s
    });
    let mut stdout = String::new();
    child
        .stdout
        .take()
        .expect("stdout is piped")
        .read_to_string(&mut stdout)
        .with_context(|| format!("reading the output of {}", cmd[0]))?;
    let (status, rss_kb) = wait_with_rusage(child.id() as libc::pid_t)
        .with_context(|| format!("waiting for {}", cmd[0]))?;
    let wall_ms = t0.elapsed().as_secs_f64() * 1e3;
    let stderr = err_reader.join().unwrap_or_default();
    if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
        bail!(
            "`{}` failed (status {status}): {}",
            cmd.join(" "),
            stderr.trim()
        );
    }
    Ok(Finished {
        wall_ms,
        rss_mb: rss_kb as f64 / 1024.0,
        stdout,
    })
}

/// Reaps `pid`: (wait status, peak RSS in KiB as Linux reports `ru_maxrss`).
fn wait_with_rusage(pid: libc::pid_t) -> Result<(i32, i64)> {
    let mut status = 0;
    // SAFETY: rusage is plain data the kernel fills; pid is our own unreaped child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        if r == pid {
            return Ok((status, usage.ru_maxrss));
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e.into());
        }
    }
}

fn range(v: &[f64]) -> (f64, f64) {
    v.iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| {
            (a.min(x), b.max(x))
        })
}

/// The transcript in faster_whisper_bench.py's JSON line.
fn fw_text(stdout: &str, script: &Path) -> Result<String> {
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .with_context(|| format!("{} printed no JSON line", script.display()))?;
    let v: serde_json::Value = serde_json::from_str(line)
        .with_context(|| format!("{}: bad JSON line `{line}`", script.display()))?;
    Ok(v["text"].as_str().unwrap_or_default().trim().to_string())
}

pub fn run(o: &WholeOpts) -> Result<u8> {
    if !o.audio.is_file() {
        bail!("{}: no such audio file", o.audio.display());
    }
    let exe = std::env::current_exe().context("finding the milkit binary")?;
    let path = |p: &Path| p.display().to_string();
    let milkit_cmd: Vec<String> = vec![
        path(&exe),
        "transcribe".into(),
        "--models".into(),
        path(o.models),
        "--language".into(),
        o.language.into(),
        "--no-timestamps".into(),
        "--temperature".into(),
        "0".into(),
        "--beam-size".into(),
        o.beam_size.to_string(),
        path(o.audio),
    ];
    let fw_cmd: Option<(Vec<String>, PathBuf)> = match o.python {
        None => None,
        Some(py) => {
            let script = super::bench_audio::find_script().with_context(|| {
                "tools/faster_whisper_bench.py not found (run from the repository)".to_string()
            })?;
            let mut c = vec![
                path(py),
                path(&script),
                "--threads".into(),
                o.threads.to_string(),
                "--compute-type".into(),
                o.compute_type.into(),
                "--language".into(),
                o.language.into(),
                "--beam-size".into(),
                o.beam_size.to_string(),
            ];
            if let Some(ck) = o.checkpoint {
                c.extend(["--model".into(), path(ck)]);
            }
            c.push(path(o.audio));
            Some((c, script))
        }
    };
    let runs = o.runs.max(1);
    let mut mk = Vec::with_capacity(runs);
    let mut fw = Vec::with_capacity(runs);
    for i in 0..=runs {
        // Alternate which goes first, so neither always follows the other's page cache.
        let order_fw_first = i % 2 == 1;
        let mut pair = |first_fw: bool| -> Result<()> {
            if first_fw {
                if let Some((c, _)) = &fw_cmd {
                    let f = run_measured(c, o.threads)?;
                    if i > 0 {
                        fw.push(f);
                    }
                }
            } else {
                let f = run_measured(&milkit_cmd, o.threads)?;
                if i > 0 {
                    mk.push(f);
                }
            }
            Ok(())
        };
        pair(order_fw_first)?;
        pair(!order_fw_first)?;
        if !o.json {
            eprintln!("{}", if i == 0 { "warm-up done" } else { "run done" });
        }
    }
    let side = |tool: &str, cmd: &[String], f: &[Finished], text: String| WholeSide {
        tool: tool.into(),
        command: cmd.to_vec(),
        wall_ms: f.iter().map(|r| r.wall_ms).collect(),
        peak_rss_mb: f.iter().map(|r| r.rss_mb).collect(),
        wall_ms_median: median(&f.iter().map(|r| r.wall_ms).collect::<Vec<_>>()),
        peak_rss_mb_median: median(&f.iter().map(|r| r.rss_mb).collect::<Vec<_>>()),
        text,
    };
    let mk_text = mk
        .last()
        .map(|r| r.stdout.trim().to_string())
        .unwrap_or_default();
    let mut report = WholeBenchReport {
        audio: path(o.audio),
        threads: o.threads,
        runs,
        sides: vec![side("milkit", &milkit_cmd, &mk, mk_text)],
        wall_ratios: vec![],
        rss_ratios: vec![],
    };
    if let Some((c, script)) = &fw_cmd {
        let text = fw_text(
            &fw.last().map(|r| r.stdout.clone()).unwrap_or_default(),
            script,
        )?;
        report.sides.push(side("faster-whisper", c, &fw, text));
        report.wall_ratios = mk
            .iter()
            .zip(&fw)
            .map(|(a, b)| a.wall_ms / b.wall_ms)
            .collect();
        report.rss_ratios = mk
            .iter()
            .zip(&fw)
            .map(|(a, b)| a.rss_mb / b.rss_mb)
            .collect();
    }
    if o.json {
        println!("{}", serde_json::to_string(&report)?);
        return Ok(0);
    }
    println!(
        "{}: {} timed runs per tool, alternating, {} threads each, {}",
        o.audio.display(),
        runs,
        o.threads,
        if o.beam_size > 1 {
            format!("{} beams", o.beam_size)
        } else {
            "greedy".to_string()
        }
    );
    println!("| tool | wall s: median (range) | peak RSS MB: median (range) |");
    println!("|---|---|---|");
    for s in &report.sides {
        let (w0, w1) = range(&s.wall_ms);
        let (r0, r1) = range(&s.peak_rss_mb);
        let label = if s.tool == "faster-whisper" {
            format!("faster-whisper {}", o.compute_type)
        } else {
            s.tool.clone()
        };
        println!(
            "| {label} | {:.2} ({:.2}–{:.2}) | {:.0} ({:.0}–{:.0}) |",
            s.wall_ms_median / 1e3,
            w0 / 1e3,
            w1 / 1e3,
            s.peak_rss_mb_median,
            r0,
            r1
        );
    }
    if !report.wall_ratios.is_empty() {
        let (a, b) = range(&report.wall_ratios);
        let (c, d) = range(&report.rss_ratios);
        println!(
            "| milkit ÷ faster-whisper, per pair | {:.2}× ({a:.2}–{b:.2}) | {:.2}× ({c:.2}–{d:.2}) |",
            median(&report.wall_ratios),
            median(&report.rss_ratios)
        );
    }
    for s in &report.sides {
        println!("{} text: {}", s.tool, s.text);
    }
    Ok(0)
}
