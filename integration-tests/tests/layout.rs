//! The source tree's layout: no two files of a crate import each other, directly or
//! through others. A file that needs another's helpers while that one needs it back is
//! two reasons to change tangled together; the fix is to move what both need below
//! them. The check reads the `crate::` and `super::` paths of every non-test line.
//! And the crates keep their layers: the model runs nothing, the adapters know the model
//! alone. And no function of the crates runs past 80 lines without a comment saying why.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

#[test]
fn no_file_imports_itself_through_others() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut found: BTreeSet<Vec<String>> = BTreeSet::new();
    let mut sources: Vec<PathBuf> = std::fs::read_dir(root.join("crates"))
        .expect("crates/")
        .map(|e| e.expect("an entry").path().join("src"))
        .filter(|p| p.is_dir())
        .collect();
    sources.push(root.join("integration-tests/src"));
    sources.sort();
    let mut files = 0;
    for src in &sources {
        let graph = crate_graph(src);
        files += graph.len();
        for circle in circles(&graph) {
            found.insert(names(&root, &circle));
        }
    }
    assert!(
        files > 100,
        "read only {files} files: is the tree where it was?"
    );
    assert!(
        found.is_empty(),
        "files that import each other, directly or through others (move what both need \
         into a module below them):\n{found:#?}"
    );
}

/// The dependencies `crate_dir`'s manifest lists under `[dependencies]`.
fn dependencies(crate_dir: &Path) -> BTreeSet<String> {
    let path = crate_dir.join("Cargo.toml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    let manifest: toml::Table = text.parse().unwrap_or_else(|e| panic!("{path:?}: {e}"));
    manifest
        .get("dependencies")
        .and_then(|d| d.as_table())
        .map(|d| d.keys().cloned().collect())
        .unwrap_or_default()
}

#[test]
fn the_model_runs_nothing_and_adapters_know_the_model_alone() {
    let crates = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../crates");
    let model = dependencies(&crates.join("model"));
    let allowed: BTreeSet<String> = [
        "fastrand",
        "humantime",
        // Constants of the system calls (opening a secret file without waiting on a pipe).
        "libc",
        "regex",
        "serde",
        "serde_json",
        "thiserror",
    ]
    .map(String::from)
    .into();
    assert!(
        model.is_subset(&allowed),
        "sluice-model depends on {:?}: the model must not pull a runtime, telemetry or \
         a web server (put process life in sluice-runtime)",
        model.difference(&allowed).collect::<Vec<_>>()
    );
    for adapter in ["mysql", "kafka", "elastic", "zk"] {
        let ours: Vec<String> = dependencies(&crates.join(adapter))
            .into_iter()
            .filter(|d| d.starts_with("sluice-") && d != "sluice-model")
            .collect();
        assert!(
            ours.is_empty(),
            "the {adapter} adapter depends on {ours:?}; adapters depend on sluice-model alone"
        );
    }
}

#[test]
fn the_check_sees_circles_through_other_files_and_grouped_imports() {
    let dir = std::env::temp_dir().join(format!("sluice-layout-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("a")).unwrap();
    let write = |p: &str, s: &str| std::fs::write(dir.join(p), s).unwrap();
    write("lib.rs", "mod a;\nmod b;\nmod c;\nmod d;\n");
    write("a.rs", "mod inner;\nuse crate::{b::B, d};\n");
    write("a/inner.rs", "use super::super::c::C;\n");
    write("b.rs", "pub fn f() {\n    crate::a::inner::g();\n}\n");
    // A test module's imports do not count.
    write(
        "c.rs",
        "pub struct C;\n#[cfg(test)]\nmod tests {\n    use crate::b::f;\n}\n",
    );
    write(
        "d.rs",
        "// crate::a is named in a comment only\nuse crate::c::C;\n",
    );
    let found = |dir: &Path| -> Vec<Vec<String>> {
        circles(&crate_graph(dir))
            .iter()
            .map(|c| names(dir, c))
            .collect()
    };
    // a → b, d; b → a/inner; a/inner → c; d → c: no circle.
    assert_eq!(found(&dir), Vec::<Vec<String>>::new());
    // c → a closes two: a → b → a/inner → c → a and a → d → c → a.
    write("c.rs", "use crate::a;\npub struct C;\n");
    assert_eq!(
        found(&dir),
        vec![vec!["a.rs", "a/inner.rs", "b.rs", "c.rs", "d.rs"]]
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Each file of the crate whose sources are in `src`, with the files its lines name.
fn crate_graph(src: &Path) -> BTreeMap<PathBuf, BTreeSet<PathBuf>> {
    let mut modules: BTreeMap<Vec<String>, PathBuf> = BTreeMap::new();
    collect(src, src, &mut modules);
    let mut graph = BTreeMap::new();
    for (module, file) in &modules {
        let text = std::fs::read_to_string(file).expect("a source file");
        let mut uses = BTreeSet::new();
        for path in named_paths(without_tests(&text), module) {
            // The longest prefix that is a file (`crate::a::b::Item` is a/b.rs or a.rs);
            // the crate's root and the file itself are no edge.
            if let Some(target) = (1..=path.len())
                .rev()
                .find_map(|n| modules.get(&path[..n]))
                .filter(|t| *t != file)
            {
                uses.insert(target.clone());
            }
        }
        graph.insert(file.clone(), uses);
    }
    graph
}

/// Module path → file, for every `.rs` file below `dir` (binaries' roots included).
fn collect(src: &Path, dir: &Path, out: &mut BTreeMap<Vec<String>, PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("a source directory") {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            collect(src, &path, out);
            continue;
        }
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let rel = path.strip_prefix(src).expect("below src");
        let mut module: Vec<String> = rel
            .with_extension("")
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        if matches!(module.last().map(String::as_str), Some("mod")) {
            module.pop();
        }
        if matches!(module.as_slice(), [one] if one == "lib" || one == "main")
            || module.first().is_some_and(|m| m == "bin")
        {
            continue; // a root: its `mod` lines name every file, its names are the API
        }
        out.insert(module, path);
    }
}

/// The text before the file's test module.
fn without_tests(text: &str) -> &str {
    text.find("#[cfg(test)]\nmod ")
        .map_or(text, |at| &text[..at])
}

/// Every module path a `crate::` or `super::` path in `text` names, made absolute;
/// grouped imports (`crate::{a::X, b::{Y, Z}}`) are expanded.
fn named_paths(text: &str, module: &[String]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let code: String = text
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let bytes = code.as_bytes();
    for (at, _) in code
        .match_indices("crate::")
        .chain(code.match_indices("super::"))
    {
        if at > 0
            && (bytes[at - 1].is_ascii_alphanumeric()
                || bytes[at - 1] == b'_'
                || bytes[at - 1] == b':')
        {
            continue; // `sluice_crate::`, or the `super::` of `super::super::`
        }
        let mut base: Vec<String> = Vec::new();
        let mut rest = &code[at..];
        if rest.starts_with("crate::") {
            rest = &rest["crate::".len()..];
        } else {
            // A file's `super` is its parent module (`a/b.rs` and `a/b/mod.rs` alike).
            base = module.to_vec();
            base.pop();
            rest = &rest["super::".len()..];
            while let Some(r) = rest.strip_prefix("super::") {
                base.pop();
                rest = r;
            }
        }
        for tail in expand(rest) {
            let mut path = base.clone();
            path.extend(tail);
            out.push(path);
        }
    }
    out
}

/// The paths at the start of `rest`: `a::b::C` is one, `{a::X, b::{Y, Z}}` several.
fn expand(rest: &str) -> Vec<Vec<String>> {
    if let Some(group) = rest.strip_prefix('{') {
        let mut depth = 0;
        let mut end = group.len();
        for (i, ch) in group.char_indices() {
            match ch {
                '{' => depth += 1,
                '}' if depth == 0 => {
                    end = i;
                    break;
                }
                '}' => depth -= 1,
                _ => {}
            }
        }
        return split_top(&group[..end])
            .into_iter()
            .flat_map(|item| expand(item.trim()))
            .collect();
    }
    let mut path = Vec::new();
    let mut rest = rest;
    loop {
        let len = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        if len == 0 {
            break;
        }
        path.push(rest[..len].to_owned());
        rest = &rest[len..];
        match rest.strip_prefix("::") {
            Some(r) if r.starts_with('{') => {
                return expand(r)
                    .into_iter()
                    .map(|tail| path.iter().cloned().chain(tail).collect())
                    .collect();
            }
            Some(r) => rest = r,
            None => break,
        }
    }
    vec![path]
}

/// `a::X, b::{Y, Z}` → [`a::X`, `b::{Y, Z}`].
fn split_top(group: &str) -> Vec<&str> {
    let (mut depth, mut start, mut out) = (0, 0, Vec::new());
    for (i, ch) in group.char_indices() {
        match ch {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&group[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&group[start..]);
    out.into_iter().filter(|s| !s.trim().is_empty()).collect()
}

/// The strongly connected components of more than one file (Tarjan's algorithm), each
/// sorted, in order.
fn circles(graph: &BTreeMap<PathBuf, BTreeSet<PathBuf>>) -> Vec<Vec<PathBuf>> {
    struct Walk<'g> {
        graph: &'g BTreeMap<PathBuf, BTreeSet<PathBuf>>,
        index: BTreeMap<&'g PathBuf, usize>,
        low: BTreeMap<&'g PathBuf, usize>,
        stack: Vec<&'g PathBuf>,
        on_stack: BTreeSet<&'g PathBuf>,
        out: Vec<Vec<PathBuf>>,
    }
    impl<'g> Walk<'g> {
        fn visit(&mut self, v: &'g PathBuf) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.graph.get(v).into_iter().flatten() {
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.on_stack.contains(w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    component.push(w.clone());
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.out.push(component);
                }
            }
        }
    }
    let mut walk = Walk {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !walk.index.contains_key(v) {
            walk.visit(v);
        }
    }
    walk.out.sort();
    walk.out
}

/// A circle's files relative to `root`, sorted.
fn names(root: &Path, circle: &[PathBuf]) -> Vec<String> {
    let mut names: Vec<String> = circle.iter().map(|f| relative(root, f)).collect();
    names.sort();
    names
}

fn relative(root: &Path, file: &Path) -> String {
    let canonical = |p: &Path| p.canonicalize().unwrap_or_else(|_| p.to_owned());
    canonical(file)
        .strip_prefix(canonical(root))
        .map_or_else(|_| file.display().to_string(), |p| p.display().to_string())
}

/// A function longer than this says why in a comment above it, or is split.
const LONG: usize = 80;

#[test]
fn no_function_runs_past_80_lines_without_saying_why() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut long = Vec::new();
    let mut files = 0;
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root.join("crates"))
        .expect("crates/")
        .map(|e| e.expect("an entry").path().join("src"))
        .filter(|p| p.is_dir())
        .collect();
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{dir:?}: {e}")) {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files += 1;
                let text = std::fs::read_to_string(&path).expect("a source file");
                for (name, line, n) in long_functions(without_tests(&text)) {
                    long.push(format!(
                        "{}:{line} {name}: {n} lines",
                        relative(&root, &path)
                    ));
                }
            }
        }
    }
    assert!(
        files > 100,
        "read only {files} files: is the tree where it was?"
    );
    assert!(
        long.is_empty(),
        "functions over {LONG} lines with no comment above saying why: split them by what \
         their parts do, or say why they stay whole (a comment naming `{LONG} lines`):\n{long:#?}"
    );
}

#[test]
fn the_length_check_sees_long_functions_and_their_reasons() {
    let body = "    x += 1;\n".repeat(LONG);
    let text = format!(
        "/// Short.\nfn short() {{\n}}\n\n/// Long.\npub(crate) async fn long(x: u8) {{\n{body}}}\n\n\
         impl A {{\n    // Longer than {LONG} lines because it is a table.\n    pub fn table(&self) {{\n{body}    }}\n\n    fn nested(&self) {{\n{body}    }}\n}}\n"
    );
    let found: Vec<(String, usize)> = long_functions(&text)
        .into_iter()
        .map(|(name, line, _)| (name, line))
        .collect();
    assert_eq!(
        found,
        [
            ("long".to_owned(), 6),
            ("nested".to_owned(), 6 + 2 * LONG + 8)
        ]
    );
}

/// `(name, line, length)` of each function of `text` longer than [`LONG`] lines (from its
/// `fn` line to its closing brace) whose comments above do not say why.
fn long_functions(text: &str) -> Vec<(String, usize, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let Some((indent, name)) = fn_start(lines[i]) else {
            i += 1;
            continue;
        };
        let Some(open) = (i..lines.len()).find(|&j| {
            let l = lines[j].trim_end();
            l.ends_with('{') || l.ends_with(';')
        }) else {
            break;
        };
        if lines[open].trim_end().ends_with('{') {
            let closing = format!("{}}}", " ".repeat(indent));
            if let Some(close) = (open + 1..lines.len()).find(|&k| lines[k].trim_end() == closing) {
                let n = close - i + 1;
                if n > LONG && !says_why(&lines[..i]) {
                    out.push((name, i + 1, n));
                }
            }
        }
        // Functions inside this one are looked at too.
        i = open + 1;
    }
    out
}

/// The indentation and name of the function `line` starts, if it starts one.
fn fn_start(line: &str) -> Option<(usize, String)> {
    let trimmed = line.trim_start();
    let mut rest = trimmed;
    loop {
        let before = rest;
        for qualifier in [
            "pub(crate) ",
            "pub(super) ",
            "pub ",
            "const ",
            "async ",
            "unsafe ",
        ] {
            rest = rest.strip_prefix(qualifier).unwrap_or(rest);
        }
        if rest == before {
            break;
        }
    }
    let name: String = rest
        .strip_prefix("fn ")?
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    (!name.is_empty()).then(|| (line.len() - trimmed.len(), name))
}

/// Whether the comments and attributes right above a function say why it is long.
fn says_why(above: &[&str]) -> bool {
    above
        .iter()
        .rev()
        .map(|l| l.trim())
        .take_while(|l| l.starts_with("//") || l.starts_with("#["))
        .any(|l| l.contains(&format!("{LONG} lines")))
}
