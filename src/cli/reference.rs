//! The command-line reference (docs/cli.md) as Markdown, generated from the clap definition
//! itself: one heading per command and subcommand with its description and usage line, then
//! every argument and flag with its help text, default and possible values. Hidden commands
//! and flags, and clap's own `--help`/`--version`, are left out. `milkit help-markdown`
//! prints it; `tests/cli_reference.rs` fails when docs/cli.md differs from it.

use clap::builder::PossibleValue;
use clap::{Arg, ArgAction, Command};
use std::fmt::Write;

/// The test that compares docs/cli.md with this output, and how to regenerate the file.
const REGENERATE: &str = "MILKIT_BLESS=1 cargo test --test cli_reference";

/// The whole reference of the command tree `root` (the binary's `Cli::command()`).
pub fn markdown(mut root: Command) -> String {
    root.build();
    let mut out = String::new();
    let name = root.get_name().to_string();
    let _ = writeln!(out, "# `{name}` command-line reference\n");
    let _ = writeln!(
        out,
        "Generated from the command-line definition by `{name} help-markdown`; a test fails \
         when this file and the code differ (`{REGENERATE}` regenerates it). Every command \
         also takes `-h`/`--help` (`--help` prints the long form shown here).\n"
    );
    describe(&mut out, &mut root);
    let _ = writeln!(out, "Commands:\n");
    contents(&mut out, &root, &name, 0);
    out.push('\n');
    for sub in visible_subcommands(&root) {
        if let Some(c) = root.find_subcommand_mut(&sub) {
            section(&mut out, c, &format!("{name} {sub}"), 2);
        }
    }
    // One trailing newline, as editors save files.
    while out.ends_with("\n\n") {
        out.pop();
    }
    out
}

/// A command's description (long form where it has one) and its usage line.
fn describe(out: &mut String, cmd: &mut Command) {
    let about = cmd
        .get_long_about()
        .or(cmd.get_about())
        .map(|a| a.to_string());
    if let Some(a) = about {
        let _ = writeln!(out, "{}\n", prose(a.trim_end()));
    }
    let usage = cmd.render_usage().to_string();
    let usage = usage.trim().trim_start_matches("Usage:").trim();
    let _ = writeln!(out, "```text\n{usage}\n```\n");
}

/// Visible subcommands of `cmd`, clap's generated `help` command left out.
fn visible_subcommands(cmd: &Command) -> Vec<String> {
    cmd.get_subcommands()
        .filter(|c| !c.is_hide_set() && c.get_name() != "help")
        .map(|c| c.get_name().to_string())
        .collect()
}

/// A nested list of links to every command's section.
fn contents(out: &mut String, cmd: &Command, path: &str, depth: usize) {
    for name in visible_subcommands(cmd) {
        let Some(sub) = cmd.find_subcommand(&name) else {
            continue;
        };
        let full = format!("{path} {name}");
        let about = sub
            .get_about()
            .map(|a| format!(": {}", prose(&one_line(&a.to_string()))))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "{}- [`{full}`](#{}){about}",
            "  ".repeat(depth),
            anchor(&full)
        );
        contents(out, sub, &full, depth + 1);
    }
}

/// GitHub's heading anchor of a heading that reads `` `text` ``: lowercase, spaces become
/// hyphens, punctuation other than hyphens and underscores dropped.
fn anchor(text: &str) -> String {
    text.chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c.to_ascii_lowercase()),
            _ => None,
        })
        .collect()
}

/// The section of `cmd` (heading level `level`) and those of its subcommands, one deeper.
fn section(out: &mut String, cmd: &mut Command, path: &str, level: usize) {
    let hashes = "#".repeat(level.min(6));
    let _ = writeln!(out, "{hashes} `{path}`\n");
    describe(out, cmd);
    let args: Vec<Arg> = cmd
        .get_arguments()
        .filter(|a| !a.is_hide_set() && !matches!(a.get_id().as_str(), "help" | "version"))
        .cloned()
        .collect();
    let (positional, options): (Vec<&Arg>, Vec<&Arg>) =
        args.iter().partition(|a| a.is_positional());
    for (title, list) in [("Arguments", positional), ("Options", options)] {
        if list.is_empty() {
            continue;
        }
        let _ = writeln!(out, "{title}:\n");
        for a in list {
            argument(out, a);
        }
        out.push('\n');
    }
    let subs = visible_subcommands(cmd);
    if !subs.is_empty() {
        let _ = writeln!(out, "Subcommands:\n");
        contents(out, cmd, path, 0);
        out.push('\n');
    }
    for name in subs {
        if let Some(sub) = cmd.find_subcommand_mut(&name) {
            section(out, sub, &format!("{path} {name}"), level + 1);
        }
    }
}

/// How an argument is written on the command line: `--out <DIR>`, `-q, --quiet`, `<PACKAGE>`.
fn spelling(a: &Arg) -> String {
    let names: Vec<String> = a
        .get_value_names()
        .map(|v| v.iter().map(|n| format!("<{n}>")).collect())
        .unwrap_or_else(|| vec![format!("<{}>", a.get_id().as_str().to_uppercase())]);
    let value = names.join(" ");
    if a.is_positional() {
        let repeated = a.get_num_args().is_some_and(|n| n.max_values() > 1);
        return if repeated {
            format!("{value}...")
        } else {
            value
        };
    }
    let mut s = String::new();
    if let Some(c) = a.get_short() {
        s.push_str(&format!("-{c}"));
    }
    if let Some(l) = a.get_long() {
        if !s.is_empty() {
            s.push_str(", ");
        }
        s.push_str(&format!("--{l}"));
    }
    if a.get_action().takes_values() {
        s.push(' ');
        s.push_str(&value);
    }
    s
}

/// One list item: spelling, required/repeatable, help (every paragraph), default and
/// possible values.
fn argument(out: &mut String, a: &Arg) {
    let mut notes = Vec::new();
    if a.is_required_set() {
        notes.push("required".to_string());
    }
    if matches!(a.get_action(), ArgAction::Append) {
        notes.push("repeatable".to_string());
    }
    if let Some(d) = a.get_value_delimiter() {
        notes.push(format!("`{d}`-separated"));
    }
    if let Some(aliases) = a.get_visible_aliases() {
        let list: Vec<String> = aliases.iter().map(|x| format!("`--{x}`")).collect();
        notes.push(format!("alias {}", list.join(", ")));
    }
    let notes = if notes.is_empty() {
        String::new()
    } else {
        format!(" ({})", notes.join(", "))
    };
    let help = a
        .get_long_help()
        .or(a.get_help())
        .map(|h| h.to_string())
        .unwrap_or_default();
    let mut paragraphs = help
        .split("\n\n")
        .map(|p| prose(&one_line(p.trim())))
        .filter(|p| !p.is_empty());
    let first = paragraphs.next().unwrap_or_default();
    let _ = writeln!(out, "- `{}`{notes}: {first}", spelling(a));
    for p in paragraphs {
        let _ = writeln!(out, "\n  {p}");
    }
    let takes_values = a.get_action().takes_values();
    let defaults: Vec<String> = a
        .get_default_values()
        .iter()
        .map(|d| d.to_string_lossy().into_owned())
        .collect();
    if takes_values && !defaults.is_empty() && !a.is_hide_default_value_set() {
        let list: Vec<String> = defaults.iter().map(|d| format!("`{d}`")).collect();
        let _ = writeln!(out, "\n  Default: {}.", list.join(", "));
    }
    let values: Vec<PossibleValue> = a
        .get_possible_values()
        .into_iter()
        .filter(|v| !v.is_hide_set())
        .collect();
    if takes_values && !values.is_empty() && !a.is_hide_possible_values_set() {
        if values.iter().any(|v| v.get_help().is_some()) {
            let _ = writeln!(out, "\n  Possible values:\n");
            for v in &values {
                let help = v
                    .get_help()
                    .map(|h| format!(": {}", prose(&one_line(&h.to_string()))))
                    .unwrap_or_default();
                let _ = writeln!(out, "  - `{}`{help}", v.get_name());
            }
        } else {
            let list: Vec<String> = values
                .iter()
                .map(|v| format!("`{}`", v.get_name()))
                .collect();
            let _ = writeln!(out, "\n  Possible values: {}.", list.join(", "));
        }
    }
}

/// A paragraph on one line (clap keeps the line breaks of some help texts).
fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Help text as Markdown prose: outside `code spans`, `<` (which would open an HTML tag) and
/// `*` (which would open emphasis, as in `models/*.toml`) are escaped.
fn prose(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut in_code = false;
    for c in s.chars() {
        match c {
            '`' => in_code = !in_code,
            '<' | '*' if !in_code => out.push('\\'),
            _ => {}
        }
        out.push(c);
    }
    out
}
