//! The module layering, checked from the source. Every path into milkit that a file in `src/`
//! names — `use crate::…` (and `super::…`, `self::…`, a child module's name) in `use`
//! statements, `crate::…` / `super::…` paths in code, `milkit::…` in the binary — must be
//! allowed by the dependency table in README.md's Layout section (`| module | may use |`), which
//! the test parses, so the documentation and the check cannot drift apart. And the graph of
//! those references between files must have no cycle.
//!
//! A module may always use itself; a file naming its own descendants (a `mod.rs` re-exporting
//! its children) is not an edge of the file graph, the reverse (a child using its parent's
//! items) is. The lexer drops comments and literals, so paths in docs and strings do not count.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Which crate of the package a file belongs to: the library, or the binary (`main.rs` and the
/// `cli` module it declares).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Crate {
    Lib,
    Bin,
}

/// A module of one crate: its path below the crate root (empty for `lib.rs` / `main.rs`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Module {
    krate: Crate,
    segs: Vec<String>,
}

impl Module {
    /// The name the dependency table uses: `main.rs` / `lib.rs` for the roots, else the
    /// module path (`verify::cli`, `cli::export`).
    fn qualified(&self) -> String {
        match (self.krate, self.segs.is_empty()) {
            (Crate::Lib, true) => "lib.rs".into(),
            (Crate::Bin, true) => "main.rs".into(),
            _ => self.segs.join("::"),
        }
    }

    /// The table's row name of the top-level module this one is in.
    fn top(&self) -> String {
        match self.segs.first() {
            Some(s) => s.clone(),
            None => self.qualified(),
        }
    }

    fn is_proper_prefix_of(&self, other: &Module) -> bool {
        self.krate == other.krate
            && self.segs.len() < other.segs.len()
            && other.segs[..self.segs.len()] == self.segs[..]
    }
}

#[derive(Clone, Debug, PartialEq)]
enum Kind {
    Ident(String),
    PathSep,
    Punct(char),
}

#[derive(Clone, Debug)]
struct Tok {
    kind: Kind,
    line: usize,
}

/// Rust tokens as far as paths need them: identifiers, `::` and single punctuation, with
/// comments, string / char literals, lifetimes and numbers dropped.
fn lex(src: &str) -> Vec<Tok> {
    let c: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let (mut i, mut line) = (0usize, 1usize);
    let at = |k: usize| c.get(k).copied().unwrap_or('\0');
    while i < c.len() {
        let ch = c[i];
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch.is_whitespace() {
            i += 1;
        } else if ch == '/' && at(i + 1) == '/' {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    line += usize::from(c[i] == '\n');
                    i += 1;
                }
            }
        } else if ch == '"' || (ch == 'b' && at(i + 1) == '"') {
            i += if ch == 'b' { 2 } else { 1 };
            while i < c.len() && c[i] != '"' {
                if c[i] == '\\' {
                    i += 1;
                }
                line += usize::from(at(i) == '\n');
                i += 1;
            }
            i += 1;
        } else if (ch == 'r'
            && (at(i + 1) == '"' || (at(i + 1) == '#' && matches!(at(i + 2), '"' | '#'))))
            || (ch == 'b' && at(i + 1) == 'r' && matches!(at(i + 2), '"' | '#'))
        {
            // Raw string: r"…", r#"…"#, br"…".
            i += if ch == 'b' { 2 } else { 1 };
            let mut hashes = 0;
            while at(i) == '#' {
                hashes += 1;
                i += 1;
            }
            i += 1; // the opening quote
            loop {
                if i >= c.len() {
                    break;
                }
                if c[i] == '"' && (1..=hashes).all(|h| at(i + h) == '#') {
                    i += 1 + hashes;
                    break;
                }
                line += usize::from(c[i] == '\n');
                i += 1;
            }
        } else if ch == '\'' {
            // A char literal ('a', '\n', '\u{1F600}') or a lifetime ('a): a lifetime is
            // skipped by its quote only, its name lexing as a harmless identifier.
            if at(i + 1) == '\\' {
                i += 2;
                while i < c.len() && c[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if at(i + 2) == '\'' {
                i += 3;
            } else {
                i += 1;
            }
        } else if ch == 'r' && at(i + 1) == '#' && (at(i + 2).is_alphabetic() || at(i + 2) == '_') {
            i += 2; // raw identifier: lexed as its name
        } else if ch.is_alphabetic() || ch == '_' {
            let start = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            out.push(Tok {
                kind: Kind::Ident(c[start..i].iter().collect()),
                line,
            });
        } else if ch.is_ascii_digit() {
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
        } else if ch == ':' && at(i + 1) == ':' {
            out.push(Tok {
                kind: Kind::PathSep,
                line,
            });
            i += 2;
        } else {
            out.push(Tok {
                kind: Kind::Punct(ch),
                line,
            });
            i += 1;
        }
    }
    out
}

fn ident(t: &[Tok], i: usize) -> Option<&str> {
    match t.get(i).map(|t| &t.kind) {
        Some(Kind::Ident(s)) => Some(s),
        _ => None,
    }
}

fn is(t: &[Tok], i: usize, k: &Kind) -> bool {
    t.get(i).is_some_and(|t| &t.kind == k)
}

/// Expands the use tree starting at `t[*i]` (after `use`) into its leaf paths, each with the
/// line of its last segment.
fn use_tree(
    t: &[Tok],
    i: &mut usize,
    mut prefix: Vec<String>,
    out: &mut Vec<(Vec<String>, usize)>,
) {
    loop {
        let Some(tok) = t.get(*i) else { return };
        match &tok.kind {
            Kind::PathSep => *i += 1,
            Kind::Ident(s) => {
                prefix.push(s.clone());
                *i += 1;
                if is(t, *i, &Kind::PathSep) {
                    *i += 1;
                    continue;
                }
                if ident(t, *i) == Some("as") {
                    *i += 2;
                }
                out.push((prefix, tok.line));
                return;
            }
            Kind::Punct('*') => {
                *i += 1;
                out.push((prefix, tok.line));
                return;
            }
            Kind::Punct('{') => {
                *i += 1;
                loop {
                    if is(t, *i, &Kind::Punct('}')) || *i >= t.len() {
                        *i += 1;
                        return;
                    }
                    let before = *i;
                    use_tree(t, i, prefix.clone(), out);
                    if is(t, *i, &Kind::Punct(',')) {
                        *i += 1;
                    } else if *i == before {
                        *i += 1; // not a use tree: skip rather than loop
                    }
                }
            }
            _ => return,
        }
    }
}

/// One reference from a file to a path: the raw path as written and its line.
struct Reference {
    path: Vec<String>,
    line: usize,
    /// The module (file module plus inline `mod x { … }` blocks) the path is written in.
    here: Module,
}

/// Every path a file names that may lead into milkit, with the module it is written in.
fn references(src: &str, file_module: &Module) -> Vec<Reference> {
    let t = lex(src);
    let mut out = Vec::new();
    let mut depth = 0usize;
    // Inline modules open here: (name, brace depth inside it).
    let mut inline: Vec<(String, usize)> = Vec::new();
    let here = |inline: &[(String, usize)]| {
        let mut m = file_module.clone();
        m.segs.extend(inline.iter().map(|(n, _)| n.clone()));
        m
    };
    let mut i = 0;
    while i < t.len() {
        match &t[i].kind {
            Kind::Punct('{') => {
                depth += 1;
                i += 1;
            }
            Kind::Punct('}') => {
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
                depth = depth.saturating_sub(1);
                i += 1;
            }
            Kind::Ident(s)
                if s == "mod" && ident(&t, i + 1).is_some() && is(&t, i + 2, &Kind::Punct('{')) =>
            {
                inline.push((ident(&t, i + 1).unwrap_or_default().to_string(), depth + 1));
                depth += 1;
                i += 3;
            }
            Kind::Ident(s) if s == "use" => {
                i += 1;
                let mut paths = Vec::new();
                use_tree(&t, &mut i, Vec::new(), &mut paths);
                let m = here(&inline);
                out.extend(paths.into_iter().map(|(path, line)| Reference {
                    path,
                    line,
                    here: m.clone(),
                }));
            }
            Kind::Ident(s)
                if matches!(s.as_str(), "crate" | "super" | "self" | "milkit")
                    && is(&t, i + 1, &Kind::PathSep)
                    && !(i > 0 && is(&t, i - 1, &Kind::PathSep)) =>
            {
                let line = t[i].line;
                let mut path = vec![s.clone()];
                i += 1;
                while is(&t, i, &Kind::PathSep) {
                    match ident(&t, i + 1) {
                        Some(seg) => {
                            path.push(seg.to_string());
                            i += 2;
                        }
                        None => break,
                    }
                }
                out.push(Reference {
                    path,
                    line,
                    here: here(&inline),
                });
            }
            _ => i += 1,
        }
    }
    out
}

/// The files of `src/`, each with its module.
fn source_files(root: &Path) -> Vec<(PathBuf, Module)> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
            .map(|e| e.expect("a directory entry").path())
            .collect();
        entries.sort();
        for p in entries {
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|e| e == "rs") {
                out.push(p);
            }
        }
    }
    let src = root.join("src");
    let mut files = Vec::new();
    walk(&src, &mut files);
    files
        .into_iter()
        .map(|p| {
            let rel = p.strip_prefix(&src).expect("under src").to_path_buf();
            let mut segs: Vec<String> = rel
                .iter()
                .map(|s| s.to_string_lossy().trim_end_matches(".rs").to_string())
                .collect();
            if segs
                .last()
                .is_some_and(|s| s == "mod" || s == "lib" || s == "main")
            {
                segs.pop();
            }
            let bin = rel == Path::new("main.rs") || segs.first().is_some_and(|s| s == "cli");
            let krate = if bin { Crate::Bin } else { Crate::Lib };
            (rel, Module { krate, segs })
        })
        .collect()
}

/// Resolves a path written in `here` to the crate and the full path below its root; `None`
/// for paths outside milkit (std, other crates) and for names that are not child modules.
fn resolve(path: &[String], here: &Module, modules: &BTreeSet<Module>) -> Option<Module> {
    let (krate, mut segs, rest) = match path.first()?.as_str() {
        "crate" => (here.krate, Vec::new(), &path[1..]),
        "milkit" if here.krate == Crate::Bin => (Crate::Lib, Vec::new(), &path[1..]),
        "self" => (here.krate, here.segs.clone(), &path[1..]),
        "super" => {
            let n = path.iter().take_while(|s| *s == "super").count();
            if n > here.segs.len() {
                return None;
            }
            (
                here.krate,
                here.segs[..here.segs.len() - n].to_vec(),
                &path[n..],
            )
        }
        first => {
            let mut child = here.clone();
            child.segs.push(first.to_string());
            if !modules.contains(&child) {
                return None;
            }
            (here.krate, here.segs.clone(), path)
        }
    };
    segs.extend(rest.iter().filter(|s| *s != "self").cloned());
    Some(Module { krate, segs })
}

/// The file module a resolved path lands in: its longest prefix that is a file.
fn file_of(path: &Module, modules: &BTreeSet<Module>) -> Module {
    (0..=path.segs.len())
        .rev()
        .map(|n| Module {
            krate: path.krate,
            segs: path.segs[..n].to_vec(),
        })
        .find(|m| modules.contains(m))
        .unwrap_or(Module {
            krate: path.krate,
            segs: Vec::new(),
        })
}

/// One row of the dependency table.
struct Row {
    modules: Vec<String>,
    /// `None`: everything.
    may_use: Option<Vec<String>>,
}

fn strip_notes(cell: &str) -> String {
    let mut out = String::new();
    let mut depth = 0;
    for ch in cell.chars() {
        match ch {
            '(' => depth += 1,
            ')' => depth -= 1,
            '`' => {}
            _ if depth == 0 => out.push(ch),
            _ => {}
        }
    }
    out
}

fn names(cell: &str) -> Vec<String> {
    strip_notes(cell)
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

/// The `| module | may use |` table of README.md's `## Layout` section.
fn dependency_table(readme: &str) -> Vec<Row> {
    let layout = readme
        .split("\n## ")
        .find(|s| s.starts_with("Layout"))
        .expect("README.md has a `## Layout` section");
    let mut lines = layout.lines().skip_while(|l| {
        let cells: Vec<_> = l.split('|').map(str::trim).collect();
        !(cells.len() > 2 && cells[1] == "module" && cells[2] == "may use")
    });
    assert!(
        lines.next().is_some(),
        "README.md's Layout section has a `| module | may use |` table"
    );
    lines
        .skip(1) // |---|---|
        .take_while(|l| l.trim_start().starts_with('|'))
        .map(|l| {
            let cells: Vec<_> = l.split('|').map(str::trim).collect();
            assert!(
                cells.len() >= 4,
                "a dependency table row has two cells: {l}"
            );
            let use_cell = strip_notes(cells[2]);
            let may_use = match use_cell.trim() {
                "everything" => None,
                "nothing in milkit" => Some(Vec::new()),
                _ => Some(names(cells[2])),
            };
            Row {
                modules: names(cells[1]),
                may_use,
            }
        })
        .collect()
}

/// `name` (a table entry like `package::fsio`) covers `qualified` (`package::fsio::write`).
fn covers(name: &str, qualified: &str) -> bool {
    qualified == name || qualified.starts_with(&format!("{name}::"))
}

struct Edge {
    from: PathBuf,
    line: usize,
    to_file: Module,
    to: Module,
}

fn edges(root: &Path) -> (Vec<(PathBuf, Module)>, Vec<Edge>) {
    let files = source_files(root);
    let modules: BTreeSet<Module> = files.iter().map(|(_, m)| m.clone()).collect();
    let mut out = Vec::new();
    for (rel, module) in &files {
        let src = std::fs::read_to_string(root.join("src").join(rel))
            .unwrap_or_else(|e| panic!("reading src/{}: {e}", rel.display()));
        for r in references(&src, module) {
            let Some(to) = resolve(&r.path, &r.here, &modules) else {
                continue;
            };
            let to_file = file_of(&to, &modules);
            out.push(Edge {
                from: rel.clone(),
                line: r.line,
                to_file,
                to,
            });
        }
    }
    (files, out)
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn every_import_in_src_is_allowed_by_the_readme_dependency_table() {
    let root = root();
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let table = dependency_table(&readme);
    let (files, edges) = edges(&root);
    let module_of: BTreeMap<&PathBuf, &Module> = files.iter().map(|(p, m)| (p, m)).collect();

    let tops: BTreeSet<String> = files
        .iter()
        .map(|(_, m)| m.top())
        .filter(|t| t != "lib.rs")
        .collect();
    let listed: BTreeSet<&str> = table
        .iter()
        .flat_map(|r| r.modules.iter().map(String::as_str))
        .collect();
    let missing: Vec<_> = tops
        .iter()
        .filter(|t| !listed.contains(t.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "top-level modules without a row in README.md's dependency table: {missing:?}"
    );
    let qualified: BTreeSet<String> = files.iter().map(|(_, m)| m.qualified()).collect();
    for row in &table {
        for name in row.modules.iter().chain(row.may_use.iter().flatten()) {
            let top = name.split("::").next().unwrap_or_default();
            assert!(
                qualified.contains(name.as_str()) || (tops.contains(top) && name.contains("::")),
                "the dependency table names `{name}`, which is no module in src/"
            );
        }
    }

    let mut bad = Vec::new();
    for e in &edges {
        let from = module_of[&e.from];
        if from.top() == e.to_file.top() && from.krate == e.to_file.krate {
            continue; // within one top-level module
        }
        let (fq, tq) = (from.qualified(), e.to.qualified());
        let rows: Vec<&Row> = table
            .iter()
            .filter(|r| r.modules.iter().any(|m| covers(m, &fq)))
            .collect();
        let allowed = rows.iter().any(|r| match &r.may_use {
            None => true,
            Some(names) => names.iter().any(|n| covers(n, &tq)),
        });
        if !allowed {
            bad.push(format!(
                "src/{}:{}: `{}` uses `{tq}`",
                e.from.display(),
                e.line,
                from.top()
            ));
        }
    }
    assert!(
        bad.is_empty(),
        "imports the dependency table in README.md (Layout) does not allow:\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_import_graph_between_files_in_src_has_no_cycle() {
    let (files, edges) = edges(&root());
    let index: BTreeMap<&Module, usize> =
        files.iter().enumerate().map(|(i, (_, m))| (m, i)).collect();
    // For each file, the files it references, each with the first line that does.
    let mut adj: Vec<BTreeMap<usize, usize>> = vec![BTreeMap::new(); files.len()];
    for e in &edges {
        let from = files
            .iter()
            .position(|(p, _)| *p == e.from)
            .expect("a source file");
        let Some(&to) = index.get(&e.to_file) else {
            continue;
        };
        if to == from || files[from].1.is_proper_prefix_of(&files[to].1) {
            continue;
        }
        adj[from]
            .entry(to)
            .and_modify(|l| *l = (*l).min(e.line))
            .or_insert(e.line);
    }
    let mut cycles = Vec::new();
    for scc in strongly_connected(&adj) {
        if scc.len() < 2 {
            continue;
        }
        // A shortest cycle through the component's first file, by breadth-first search.
        let start = scc[0];
        let members: BTreeSet<usize> = scc.iter().copied().collect();
        let mut prev: BTreeMap<usize, usize> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([start]);
        let mut last = None;
        'bfs: while let Some(n) = queue.pop_front() {
            for &m in adj[n].keys() {
                if m == start {
                    last = Some(n);
                    break 'bfs;
                }
                if members.contains(&m) && !prev.contains_key(&m) && m != start {
                    prev.insert(m, n);
                    queue.push_back(m);
                }
            }
        }
        let mut path = vec![start];
        let mut n = last.expect("a strongly connected component has a cycle");
        while n != start {
            path.push(n);
            n = prev[&n];
        }
        path[1..].reverse();
        path.push(start);
        let steps: Vec<String> = path
            .windows(2)
            .map(|w| {
                format!(
                    "src/{}:{} → src/{}",
                    files[w[0]].0.display(),
                    adj[w[0]][&w[1]],
                    files[w[1]].0.display()
                )
            })
            .collect();
        let all: Vec<String> = scc
            .iter()
            .map(|&n| format!("src/{}", files[n].0.display()))
            .collect();
        cycles.push(format!(
            "cycle among {}:\n  {}",
            all.join(", "),
            steps.join("\n  ")
        ));
    }
    assert!(
        cycles.is_empty(),
        "import cycles between files of src/:\n{}",
        cycles.join("\n")
    );
}

/// Tarjan's strongly connected components, each sorted.
fn strongly_connected(adj: &[BTreeMap<usize, usize>]) -> Vec<Vec<usize>> {
    struct S<'a> {
        adj: &'a [BTreeMap<usize, usize>],
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on: Vec<bool>,
        stack: Vec<usize>,
        next: usize,
        out: Vec<Vec<usize>>,
    }
    fn visit(s: &mut S, v: usize) {
        s.index[v] = Some(s.next);
        s.low[v] = s.next;
        s.next += 1;
        s.stack.push(v);
        s.on[v] = true;
        for &w in s.adj[v].keys() {
            match s.index[w] {
                None => {
                    visit(s, w);
                    s.low[v] = s.low[v].min(s.low[w]);
                }
                Some(iw) if s.on[w] => s.low[v] = s.low[v].min(iw),
                Some(_) => {}
            }
        }
        if Some(s.low[v]) == s.index[v] {
            let mut scc = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on[w] = false;
                scc.push(w);
                if w == v {
                    break;
                }
            }
            scc.sort();
            s.out.push(scc);
        }
    }
    let n = adj.len();
    let mut s = S {
        adj,
        index: vec![None; n],
        low: vec![0; n],
        on: vec![false; n],
        stack: Vec::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in 0..n {
        if s.index[v].is_none() {
            visit(&mut s, v);
        }
    }
    s.out
}

#[test]
fn the_lexer_skips_comments_and_literals_and_the_use_tree_expands_groups() {
    let src = "// use crate::a;\n/* crate::b /* nested */ */ let s = \"crate::c\"; let r = r#\"crate::d\"#;\n\
               let ch = '\\''; fn f<'a>() {}\nuse crate::{ir::{self, Model}, ops::Builder as B};\n\
               mod inner { use super::x::*; }\nlet v = crate::kernels::to_f32(t);\n";
    let m = Module {
        krate: Crate::Lib,
        segs: vec!["runtime".into()],
    };
    let got: Vec<(String, usize, String)> = references(src, &m)
        .into_iter()
        .map(|r| (r.path.join("::"), r.line, r.here.qualified()))
        .collect();
    let want = [
        ("crate::ir::self", 4, "runtime"),
        ("crate::ir::Model", 4, "runtime"),
        ("crate::ops::Builder", 4, "runtime"),
        ("super::x", 5, "runtime::inner"),
        ("crate::kernels::to_f32", 6, "runtime"),
    ];
    let want: Vec<(String, usize, String)> = want
        .iter()
        .map(|(p, l, h)| (p.to_string(), *l, h.to_string()))
        .collect();
    assert_eq!(got, want);
}
