//! docs/cli.md is the command-line reference `milkit help-markdown` generates from the clap
//! definition: a test fails when the file and the code differ (`MILKIT_BLESS=1 cargo test
//! --test cli_reference` regenerates it), and the reference names every command `--help`
//! lists, every flag of a command's `--help`, and nothing hidden; every command and flag
//! README.md shows exists.

use std::path::Path;
use std::process::Command;

/// Runs the binary; returns its stdout, asserting success.
fn milkit(args: &[&str]) -> String {
    let o = Command::new(env!("CARGO_BIN_EXE_milkit"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "milkit {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

fn reference() -> String {
    milkit(&["help-markdown"])
}

/// The command names a `--help` page lists under "Commands:" (clap's `help` left out).
fn commands_of(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_string)
        .collect()
}

/// The long flags a `--help` page lists (`--help`/`--version` left out).
fn flags_of(help: &str) -> Vec<String> {
    help.lines()
        .filter_map(|l| {
            let l = l.trim_start();
            let l = l
                .strip_prefix('-')
                .filter(|r| !r.starts_with('-'))
                .map_or(l, |r| r.get(3..).unwrap_or(""));
            l.strip_prefix("--")
        })
        .map(|r| r.split([' ', '=', '<']).next().unwrap_or("").to_string())
        .filter(|f| !f.is_empty() && f != "help" && f != "version")
        .collect()
}

#[test]
fn docs_cli_md_matches_the_command_line_definition() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/cli.md");
    let text = reference();
    if std::env::var("MILKIT_BLESS").is_ok_and(|v| v == "1") {
        std::fs::write(&path, &text).unwrap();
    }
    let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        on_disk == text,
        "{} is out of date: regenerate with MILKIT_BLESS=1 cargo test --test cli_reference",
        path.display()
    );
}

#[test]
fn the_reference_has_a_section_per_command_and_every_flag_of_its_help() {
    let doc = reference();
    let top = commands_of(&milkit(&["--help"]));
    assert!(top.len() >= 10, "{top:?}");
    let mut paths: Vec<Vec<String>> = Vec::new();
    for c in top {
        let subs = commands_of(&milkit(&[&c, "--help"]));
        paths.push(vec![c.clone()]);
        paths.extend(subs.into_iter().map(|s| vec![c.clone(), s]));
    }
    assert!(paths.iter().any(|p| p == &["bench", "gemm"]), "{paths:?}");
    for p in &paths {
        let heading = format!("# `milkit {}`\n", p.join(" "));
        let start = doc
            .find(&heading)
            .unwrap_or_else(|| panic!("no section `milkit {}`", p.join(" ")));
        // The section runs to the next heading.
        let body = &doc[start + heading.len()..];
        let body = &body[..body.find("\n#").unwrap_or(body.len())];
        let mut args: Vec<&str> = p.iter().map(String::as_str).collect();
        args.push("--help");
        let flags = flags_of(&milkit(&args));
        for f in flags {
            assert!(
                body.contains(&format!("`--{f}")) || body.contains(&format!(", --{f}")),
                "section `milkit {}` does not describe --{f}",
                p.join(" ")
            );
        }
    }
}

#[test]
fn hidden_commands_and_flags_stay_out_of_the_reference() {
    let doc = reference();
    assert!(!milkit(&["--help"]).contains("help-markdown"));
    assert!(!doc.contains("## `milkit help-markdown`"), "hidden command");
    // `export --stats` is an internal flag of `milkit bench`.
    assert!(!doc.contains("`--stats`"), "hidden flag");
    assert!(
        !doc.contains("`--help`:"),
        "clap's own flags are described once, at the top"
    );
}

/// The `milkit …` command lines of README.md's shell blocks: the Tour's lines, and each
/// `$M …` step of the main job.
fn readme_command_lines() -> Vec<String> {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let mut out = Vec::new();
    let mut in_sh = false;
    for line in readme.lines() {
        if line.starts_with("```") {
            in_sh = line == "```sh";
            continue;
        }
        if !in_sh {
            continue;
        }
        let line = line.split("  #").next().unwrap().trim();
        if let Some(rest) = line.strip_prefix("milkit ") {
            out.push(rest.to_string());
        }
        for step in line.split("&&").map(str::trim) {
            if let Some(rest) = step.strip_prefix("$M ") {
                out.push(rest.to_string());
            }
        }
    }
    out
}

#[test]
fn every_command_and_flag_the_readme_shows_exists() {
    let lines = readme_command_lines();
    assert!(
        lines.len() >= 10,
        "README's command lines not found: {lines:?}"
    );
    for line in &lines {
        let words: Vec<&str> = line.split_whitespace().collect();
        // Descend through subcommands as long as the next word is one.
        let mut path: Vec<&str> = Vec::new();
        let mut help = milkit(&["--help"]);
        for w in &words {
            if !commands_of(&help).iter().any(|c| c == w) {
                break;
            }
            path.push(w);
            let mut args = path.clone();
            args.push("--help");
            help = milkit(&args);
        }
        assert!(!path.is_empty(), "README: `milkit {line}` names no command");
        let flags = flags_of(&help);
        for w in words.iter().filter(|w| w.starts_with("--")) {
            let flag = w.split('=').next().unwrap();
            assert!(
                flags.iter().any(|f| f == &flag[2..]),
                "README: `milkit {line}`: `milkit {}` has no flag {flag}",
                path.join(" ")
            );
        }
    }
}
