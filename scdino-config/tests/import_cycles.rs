//! No file of a crate imports, directly or around a loop, a file that imports it back: such a
//! loop means neither file can be read, tested or moved without the other.
//!
//! A file imports the file of each module that one of its paths names: `use` trees (grouped
//! ones too, `pub use` re-exports included) and paths in code, starting with `crate::`,
//! `super::`, `self::` or a child module's name (`use stages::Target` in `pipeline/mod.rs` is
//! `self::stages::Target`). A path resolves to its longest prefix that is a module with a file,
//! then on through that file's `use` of the next name, so that a re-export cannot hide a loop:
//! `crate::data::shards::shard_sequential_order` imports `data/shards/order.rs`, which defines
//! it, not `data/shards/mod.rs`, which re-exports it. A test module counts as part of its file
//! (its `use super::*` names the file itself); `mod x;` is not an import, nor is a path in a
//! comment or a string.
//!
//! A file's imports of its own submodules are left out: a module file declares its children,
//! re-exports and calls them, while they use what it defines (its error type, shared
//! arguments), and counting both directions would call every such module a cycle. The cost: a
//! loop that has to pass from a module file down into its own child is not seen.
//!
//! `trainer` and `launcher` have both `lib.rs` and `main.rs`, two crates: `main.rs` with the
//! modules it declares (`trainer/src/cli`, `launcher/src/image_cmd.rs`) is the binary, whose
//! `crate::` is `main.rs`, and its `trainer::…`/`launcher::…` paths name an extern crate, so
//! they leave the graph (the library cannot import the binary back).
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

const CRATES: [&str; 4] = [
    "trainer/src",
    "launcher/src",
    "scdino-config/src",
    "scdino-base/src",
];

/// The source of each file of a crate, keyed by its path under `src/`.
type Files = BTreeMap<String, String>;
/// For each file, the files it imports and the first line that does.
type Graph = BTreeMap<String, BTreeMap<String, usize>>;

/// The module path of a file under `src/` (`lib.rs`, `main.rs`: the root).
fn module_of(file: &str) -> Vec<String> {
    let file = file.strip_suffix(".rs").unwrap();
    let mut path: Vec<String> = file.split('/').map(String::from).collect();
    if matches!(
        path.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        path.pop();
    }
    path
}

/// The source with comments, string and char literals blanked (newlines kept).
fn strip(src: &str) -> String {
    let c: Vec<char> = src.chars().collect();
    let at = |i: usize| c.get(i).copied().unwrap_or('\0');
    let ident = |ch: char| ch.is_alphanumeric() || ch == '_';
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < c.len() {
        let start = i;
        let hashes = c[i + 1..].iter().take_while(|&&h| h == '#').count();
        let raw = c[i] == 'r'
            && at(i + 1 + hashes) == '"'
            && (i == 0
                || !ident(c[i - 1])
                || (matches!(c[i - 1], 'b' | 'c') && !ident(at(i.wrapping_sub(2)))));
        if c[i] == '/' && at(i + 1) == '/' {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if c[i] == '/' && at(i + 1) == '*' {
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
                    i += 1;
                }
            }
        } else if raw {
            i += hashes + 2;
            while i < c.len() && !(c[i] == '"' && c[i + 1..].iter().take(hashes).all(|&h| h == '#'))
            {
                i += 1;
            }
            i += hashes + 1;
        } else if c[i] == '"' {
            i += 1;
            while i < c.len() && c[i] != '"' {
                i += if c[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
        } else if c[i] == '\'' && (at(i + 1) == '\\' || at(i + 2) == '\'') {
            // A char literal; `'a` without a closing quote is a lifetime and stays.
            i += if at(i + 1) == '\\' { 3 } else { 2 };
            while i < c.len() && c[i] != '\'' {
                i += 1;
            }
            i += 1;
        } else {
            out.push(c[i]);
            i += 1;
            continue;
        }
        let end = i.min(c.len());
        out.extend(
            c[start..end]
                .iter()
                .map(|&ch| if ch == '\n' { '\n' } else { ' ' }),
        );
    }
    out
}

/// Identifiers, `::` and single punctuation characters, with their lines.
fn tokens(code: &str) -> Vec<(String, usize)> {
    let mut out = Vec::new();
    let mut line = 1;
    let mut chars = code.chars().peekable();
    while let Some(ch) = chars.next() {
        if ch == '\n' {
            line += 1;
        } else if ch.is_alphanumeric() || ch == '_' {
            let mut word = ch.to_string();
            while let Some(&n) = chars.peek().filter(|n| n.is_alphanumeric() || **n == '_') {
                word.push(n);
                chars.next();
            }
            out.push((word, line));
        } else if ch == ':' && chars.peek() == Some(&':') {
            chars.next();
            out.push(("::".into(), line));
        } else if !ch.is_whitespace() {
            out.push((ch.to_string(), line));
        }
    }
    out
}

fn is_ident(s: &str) -> bool {
    s.starts_with(|c: char| c.is_alphabetic() || c == '_')
}

/// A path that a file names, made absolute (from the crate root).
struct Import {
    path: Vec<String>,
    line: usize,
    /// The name it binds in the file's module: an item of a module-level `use` (its alias, or
    /// `*` for a glob).
    binds: Option<String>,
}

/// Reads the path (or `use` tree) starting at token `i`, pushing each full path (a glob ending
/// in `*`) with its alias; returns the index after it.
fn use_tree(
    t: &[(String, usize)],
    mut i: usize,
    mut prefix: Vec<String>,
    out: &mut Vec<(Vec<String>, Option<String>)>,
) -> usize {
    let text = |i: usize| t.get(i).map_or("", |(s, _)| s.as_str());
    loop {
        if text(i) == "{" {
            i += 1;
            while !matches!(text(i), "}" | "") {
                let next = use_tree(t, i, prefix.clone(), out);
                i = next.max(i + 1); // past anything it does not read
                if text(i) == "," {
                    i += 1;
                }
            }
            return i + 1;
        }
        if text(i) == "*" {
            prefix.push("*".into());
            out.push((prefix, None));
            return i + 1;
        }
        if !is_ident(text(i)) {
            return i;
        }
        prefix.push(text(i).to_string());
        i += 1;
        if text(i) == "as" {
            out.push((prefix, Some(text(i + 1).to_string())));
            return i + 2;
        }
        if text(i) != "::" {
            out.push((prefix, None));
            return i;
        }
        i += 1;
    }
}

/// What a file names and what it defines (the names after `fn`, `struct`, ... anywhere).
struct Scan {
    imports: Vec<Import>,
    defines: BTreeSet<String>,
}

/// `module` is the file's module; `has_file` tells which modules have a file (to recognise a
/// path through a child module).
fn scan(src: &str, module: &[String], has_file: &dyn Fn(&[String]) -> bool) -> Scan {
    let t = tokens(&strip(src));
    let text = |i: usize| t.get(i).map_or("", |(s, _)| s.as_str());
    let defines = t
        .windows(2)
        .filter(|w| {
            matches!(
                w[0].0.as_str(),
                "struct" | "enum" | "union" | "trait" | "type" | "fn" | "const" | "static" | "mod"
            )
        })
        .map(|w| w[1].0.clone())
        .collect();
    let mut imports = Vec::new();
    // Inline `mod name {` blocks (the `tests` modules) around the current token, with the brace
    // depth inside each: `super::` in one of them names the file's own module.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0;
    let mut i = 0;
    while i < t.len() {
        let mut here = module.to_vec();
        here.extend(inline.iter().map(|(name, _)| name.clone()));
        let word = text(i);
        let before = i.checked_sub(1).map_or("", text);
        let starts_path = (text(i + 1) == "::" || before == "use")
            && !matches!(before, "::" | "." | "in")
            && (matches!(word, "crate" | "super" | "self")
                || (is_ident(word) && has_file(&[here.as_slice(), &[word.to_string()]].concat())));
        if word == "mod" && text(i + 2) == "{" {
            inline.push((text(i + 1).to_string(), depth + 1));
        } else if word == "{" {
            depth += 1;
        } else if word == "}" {
            depth -= 1;
            inline.retain(|(_, d)| *d <= depth);
        } else if starts_path {
            let line = t[i].1;
            let binds = before == "use" && inline.is_empty();
            let mut paths = Vec::new();
            i = use_tree(&t, i, Vec::new(), &mut paths);
            for (segs, alias) in paths {
                let from_root = segs[0] == "crate";
                let mut path = if from_root { Vec::new() } else { here.clone() };
                for seg in &segs[usize::from(from_root)..] {
                    match seg.as_str() {
                        "super" => {
                            path.pop();
                        }
                        "self" => {}
                        _ => path.push(seg.clone()),
                    }
                }
                let binds = binds
                    .then(|| alias.or_else(|| path.last().cloned()))
                    .flatten();
                imports.push(Import { path, line, binds });
            }
            continue;
        }
        i += 1;
    }
    Scan { imports, defines }
}

/// The import graph of one crate.
fn graph(files: &Files) -> Graph {
    // Top-level modules that `main.rs` declares belong to the binary, the rest to the library.
    let bin_mods: BTreeSet<String> = files.get("main.rs").map_or_else(BTreeSet::new, |main| {
        let t = tokens(&strip(main));
        t.windows(3)
            .filter(|w| w[0].0 == "mod" && w[2].0 == ";")
            .map(|w| w[1].0.clone())
            .collect()
    });
    let in_bin = |file: &str| {
        file == "main.rs"
            || module_of(file)
                .first()
                .is_some_and(|m| bin_mods.contains(m))
    };
    let mut graph = Graph::new();
    for bin in [false, true] {
        let modules: BTreeMap<Vec<String>, &String> = files
            .keys()
            .filter(|f| in_bin(f) == bin && (bin || f.as_str() != "main.rs"))
            .map(|f| (module_of(f), f))
            .collect();
        let has_file = |m: &[String]| modules.contains_key(m);
        let scans: BTreeMap<&String, Scan> = modules
            .iter()
            .map(|(m, f)| (*f, scan(&files[*f], m, &has_file)))
            .collect();
        // The file that defines the item a path names, following the `use` (or glob `use`)
        // that brought the name into its module.
        let resolve = |mut path: Vec<String>| -> Option<&String> {
            for _ in 0..16 {
                path.retain(|s| s != "*");
                let n = (0..=path.len()).rev().find(|&n| has_file(&path[..n]))?;
                let file = modules[&path[..n]];
                let Some(name) = path.get(n) else {
                    return Some(file);
                };
                if scans[file].defines.contains(name) {
                    return Some(file);
                }
                let bound = scans[file]
                    .imports
                    .iter()
                    .find_map(|imp| match imp.binds.as_deref() {
                        Some(b) if b == name => Some(imp.path.clone()),
                        Some("*") => {
                            let glob = &imp.path[..imp.path.len() - 1];
                            let defines = &scans[modules.get(glob)?].defines;
                            defines
                                .contains(name)
                                .then(|| [glob, std::slice::from_ref(name)].concat())
                        }
                        _ => None,
                    });
                match bound {
                    Some(to) if to != path[..=n] => path = [to.as_slice(), &path[n + 1..]].concat(),
                    _ => return Some(file),
                }
            }
            None
        };
        for (file, found) in &scans {
            let edges = graph.entry(file.to_string()).or_default();
            for imp in &found.imports {
                match resolve(imp.path.clone()) {
                    Some(to) if !module_of(to).starts_with(&module_of(file)) => {
                        edges.entry(to.to_string()).or_insert(imp.line);
                    }
                    _ => {}
                }
            }
        }
    }
    graph
}

/// The strongly connected components of more than one file (Tarjan).
fn cycles(graph: &Graph) -> Vec<Vec<String>> {
    struct Tarjan<'a> {
        graph: &'a Graph,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        out: Vec<Vec<String>>,
    }
    impl<'a> Tarjan<'a> {
        fn visit(&mut self, v: &'a str) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            for w in self.graph[v].keys() {
                if !self.index.contains_key(w.as_str()) {
                    self.visit(w);
                    self.low.insert(v, self.low[v].min(self.low[w.as_str()]));
                } else if self.stack.contains(&w.as_str()) {
                    self.low.insert(v, self.low[v].min(self.index[w.as_str()]));
                }
            }
            if self.low[v] == self.index[v] {
                let at = self.stack.iter().rposition(|&x| x == v).unwrap();
                let scc: Vec<String> = self.stack.drain(at..).map(String::from).collect();
                if scc.len() > 1 {
                    self.out.push(scc);
                }
            }
        }
    }
    let mut t = Tarjan {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !t.index.contains_key(v.as_str()) {
            t.visit(v);
        }
    }
    t.out
}

/// A component as one loop through its first file (shortest, found breadth-first), then every
/// import inside it with the line that makes it.
fn describe(graph: &Graph, scc: &[String], dir: &str) -> String {
    let inside = |f: &String| scc.contains(f);
    let start = &scc[0];
    let mut came_from: BTreeMap<&String, &String> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([start]);
    'search: while let Some(v) = queue.pop_front() {
        for w in graph[v].keys().filter(|w| inside(w)) {
            if w == start {
                came_from.insert(start, v);
                break 'search;
            }
            if !came_from.contains_key(w) {
                came_from.insert(w, v);
                queue.push_back(w);
            }
        }
    }
    let mut lap = vec![start];
    while let Some(&prev) = came_from.get(lap.last().unwrap()).filter(|p| **p != start) {
        lap.push(prev);
    }
    lap.push(start);
    lap.reverse();
    let name = |f: &String| format!("{dir}/{f}");
    let mut text = lap.iter().map(|f| name(f)).collect::<Vec<_>>().join(" -> ");
    for from in scc {
        for (to, line) in graph[from].iter().filter(|(to, _)| inside(to)) {
            text += &format!("\n    {}:{line} imports {}", name(from), name(to));
        }
    }
    text
}

fn read_crate(dir: &Path, under: &Path, files: &mut Files) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            read_crate(&path, under, files);
        } else if path.extension().is_some_and(|x| x == "rs") {
            let rel = path
                .strip_prefix(under)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/");
            files.insert(rel, std::fs::read_to_string(&path).unwrap());
        }
    }
}

#[test]
fn no_crate_has_an_import_cycle_between_its_files() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let (mut found, mut imports) = (Vec::new(), 0);
    for dir in CRATES {
        let mut files = Files::new();
        read_crate(&root.join(dir), &root.join(dir), &mut files);
        let graph = graph(&files);
        imports += graph.values().map(BTreeMap::len).sum::<usize>();
        found.extend(cycles(&graph).iter().map(|scc| describe(&graph, scc, dir)));
    }
    // The trainer alone has hundreds: far fewer means the scanner lost them.
    assert!(
        imports > 200,
        "only {imports} imports between files: is the scanner broken?"
    );
    assert!(
        found.is_empty(),
        "import cycles between files:\n{}",
        found.join("\n")
    );
}

/// The checker on small crates held in memory.
mod checker {
    use super::*;

    fn crate_of(files: &[(&str, &str)]) -> Graph {
        graph(
            &files
                .iter()
                .map(|(p, s)| (p.to_string(), s.to_string()))
                .collect(),
        )
    }

    fn imported<'a>(g: &'a Graph, file: &str) -> Vec<&'a str> {
        g[file].keys().map(String::as_str).collect()
    }

    fn loops(files: &[(&str, &str)]) -> Vec<String> {
        let g = crate_of(files);
        cycles(&g)
            .iter()
            .map(|scc| describe(&g, scc, "src").lines().next().unwrap().to_string())
            .collect()
    }

    #[test]
    fn two_files_importing_each_other_through_crate() {
        let files = [
            ("lib.rs", "mod a;\nmod b;\n"),
            ("a.rs", "use crate::b::B;\npub struct A;\n"),
            (
                "b.rs",
                "pub struct B;\nfn f() -> crate::a::A {\n    crate::a::A\n}\n",
            ),
        ];
        assert_eq!(loops(&files), ["src/a.rs -> src/b.rs -> src/a.rs"]);
        let g = crate_of(&files);
        let text = describe(&g, &cycles(&g)[0], "src");
        assert!(text.contains("src/a.rs:1 imports src/b.rs"), "{text}");
        assert!(text.contains("src/b.rs:2 imports src/a.rs"), "{text}");
    }

    #[test]
    fn a_loop_of_three_through_super_and_a_grouped_use() {
        let files = [
            ("lib.rs", "mod m;\nmod z;\n"),
            ("z.rs", "pub struct Z;\n"),
            ("m/mod.rs", "mod w;\nmod x;\nmod y;\n"),
            ("m/x.rs", "pub struct X;\nfn f() {\n    super::y::g()\n}\n"),
            (
                "m/y.rs",
                "use crate::{\n    z::Z,\n    m::{\n        w::W as V,\n    },\n};\npub fn g() {}\n",
            ),
            ("m/w.rs", "pub struct W(super::x::X);\n"),
        ];
        assert_eq!(
            loops(&files),
            ["src/m/w.rs -> src/m/x.rs -> src/m/y.rs -> src/m/w.rs"]
        );
        assert_eq!(imported(&crate_of(&files), "m/y.rs"), ["m/w.rs", "z.rs"]);
    }

    #[test]
    fn a_module_and_its_children_are_no_loop() {
        let files = [
            ("lib.rs", "pub mod a;\npub use a::A;\npub struct Config;\n"),
            (
                "a/mod.rs",
                "mod b;\npub use b::B;\npub enum AError {}\npub struct A;\npub fn run() {\n    b::go()\n}\n",
            ),
            (
                "a/b.rs",
                "use super::AError;\nuse super::super::Config;\npub struct B;\npub fn go() {}\n\
                 #[cfg(test)]\nmod tests {\n    use super::*;\n    use crate::a::b::B;\n}\n",
            ),
        ];
        assert!(loops(&files).is_empty());
        let g = crate_of(&files);
        assert_eq!(imported(&g, "a/b.rs"), ["a/mod.rs", "lib.rs"]);
        assert!(g["a/mod.rs"].is_empty() && g["lib.rs"].is_empty());
    }

    #[test]
    fn a_re_export_does_not_hide_a_loop() {
        for export in ["pub use order::shard_order;", "pub use self::order::*;"] {
            let files = [
                ("lib.rs", "mod data;\nmod train;\n"),
                ("data/mod.rs", &*format!("mod order;\n{export}\n")),
                (
                    "data/order.rs",
                    "pub fn shard_order() {\n    crate::train::sampler::epoch()\n}\n",
                ),
                ("train/mod.rs", "pub mod sampler;\n"),
                (
                    "train/sampler.rs",
                    "#[cfg(test)]\nmod tests {\n    use crate::data::shard_order;\n}\n",
                ),
            ];
            assert_eq!(
                loops(&files),
                ["src/data/order.rs -> src/train/sampler.rs -> src/data/order.rs"],
                "{export}"
            );
        }
    }

    #[test]
    fn comments_and_strings_import_nothing() {
        let files = [
            ("lib.rs", "mod a;\nmod b;\nmod c;\n"),
            (
                "a.rs",
                "//! See crate::b.\n/// Like [`crate::b::B`].\n/* use crate::b::B; /* nested */ crate::b */\n\
                 const S: &str = \"use crate::b::B; \\\" crate::b\";\nconst R: &str = r#\"crate::b::B \" crate::b\"#;\n\
                 const Q: [char; 2] = ['\"', '\\''];\nfn f<'a>(x: &'a str) -> crate::c::C {\n    todo!()\n}\n",
            ),
            ("b.rs", "use crate::a;\npub struct B;\n"),
            ("c.rs", "pub struct C;\n"),
        ];
        assert!(loops(&files).is_empty());
        assert_eq!(imported(&crate_of(&files), "a.rs"), ["c.rs"]);
    }

    #[test]
    fn a_binary_beside_its_library_is_its_own_crate() {
        let files = [
            ("lib.rs", "pub mod help;\npub struct Args;\n"),
            ("help.rs", "pub fn help() {}\n"),
            (
                "main.rs",
                "mod cli;\nfn main() {\n    cli::run()\n}\npub struct Args;\n",
            ),
            ("cli/mod.rs", "mod cmd;\npub fn run() {\n    cmd::go()\n}\n"),
            (
                "cli/cmd.rs",
                "use crate::Args;\npub fn go() {\n    app::help::help()\n}\n",
            ),
        ];
        let g = crate_of(&files);
        assert_eq!(imported(&g, "cli/cmd.rs"), ["main.rs"]);
        assert!(["main.rs", "cli/mod.rs", "lib.rs", "help.rs"]
            .iter()
            .all(|f| g[*f].is_empty()));
    }
}
