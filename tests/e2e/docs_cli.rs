//! The commands the documentation writes (README.md, docs/*.md, slurm/README.md) and the
//! header comments of the files a user reads first (Containerfile, scripts/, bench/, slurm/,
//! enroot/, configs/, the CI workflows): every `trainer …` / `launcher …` in backticks, and in
//! a comment every line that runs one (`#   launcher image build --tag …`, continuation lines
//! joined), names subcommands that exist and only flags those subcommands take, checked
//! against the binaries' own `--help`, so a renamed command or flag cannot leave them behind.
use super::util::{bin, text};
use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

/// `--help` of `binary path…`.
fn help(cache: &mut HashMap<Vec<String>, String>, binary: &str, path: &[String]) -> String {
    let key: Vec<String> = std::iter::once(binary.to_string())
        .chain(path.iter().cloned())
        .collect();
    cache
        .entry(key)
        .or_insert_with(|| {
            let out = Command::new(bin(binary))
                .args(path)
                .arg("--help")
                .output()
                .unwrap();
            text(&out.stdout) + &text(&out.stderr)
        })
        .clone()
}

/// The subcommands a `--help` lists.
fn subcommands(help: &str) -> Vec<String> {
    let Some((_, rest)) = help.split_once("Commands:") else {
        return vec![];
    };
    rest.split("Options:")
        .next()
        .unwrap_or("")
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

#[test]
fn documented_commands_exist_with_the_flags_they_are_written_with() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = vec![root.join("README.md"), root.join("slurm/README.md")];
    let mut docs: Vec<_> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    // (file, text, whether the text is a backticked span: a span must be a command; a
    // comment line that starts with the binary is skipped unless a subcommand follows, as in
    // "trainer refuses to start …").
    let mut spans: Vec<(std::path::PathBuf, String, bool)> = vec![];
    for file in &files {
        let doc = std::fs::read_to_string(file).unwrap();
        for span in doc.split('`').skip(1).step_by(2) {
            spans.push((file.clone(), span.to_string(), true));
        }
    }
    for file in commented_files(&root) {
        let comments = comment_text(&std::fs::read_to_string(&file).unwrap());
        for span in comments.split('`').skip(1).step_by(2) {
            spans.push((file.clone(), span.to_string(), true));
        }
        for line in comments.lines() {
            let plain: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
            for binary in ["trainer ", "launcher "] {
                // A command line: the binary opens the comment or follows a colon.
                let at = plain
                    .match_indices(binary)
                    .find(|(i, _)| plain[..*i].trim().is_empty() || plain[..*i].ends_with(": "));
                if let Some((i, _)) = at {
                    spans.push((file.clone(), plain[i..].to_string(), false));
                }
            }
        }
    }
    let mut cache = HashMap::new();
    let mut checked = 0;
    let mut wrong = Vec::new();
    for (file, span, strict) in &spans {
        let file = file.as_path();
        let span = span.as_str();
        {
            let all: Vec<&str> = span.split_whitespace().collect();
            // `trainer launch … -- STAGE …` runs another trainer command: check both.
            let mut commands: Vec<Vec<&str>> = vec![];
            if let Some(at) = all.iter().position(|w| *w == "--") {
                let mut inner = vec![all[0]];
                inner.extend(&all[at + 1..]);
                commands.push(all[..at].to_vec());
                commands.push(inner);
            } else {
                commands.push(all);
            }
            for words in commands {
                let Some(&binary) = words.first() else {
                    continue;
                };
                if !matches!(binary, "trainer" | "launcher") || words.len() < 2 {
                    continue;
                }
                // Walk the subcommands; `a|b` (or `a\|b` in a table) lists alternatives.
                let mut paths: Vec<Vec<String>> = vec![vec![]];
                let mut i = 1;
                if words.get(1).is_some_and(|w| {
                    w.starts_with('<') || w.starts_with("..") || w.starts_with('…')
                }) {
                    continue; // `trainer <stage> …`, `-- ...`: a placeholder for any subcommand
                }
                while i < words.len() && !words[i].starts_with('-') && !words[i].starts_with('<') {
                    let alternatives: Vec<String> = words[i]
                        .split('|')
                        .map(|a| a.trim_end_matches('\\').to_string())
                        .collect();
                    let known = subcommands(&help(&mut cache, binary, &paths[0]));
                    if !alternatives.iter().all(|a| known.contains(a)) {
                        if known.is_empty() {
                            break; // a leaf: the rest are arguments
                        }
                        if !*strict && i == 1 {
                            paths.clear(); // prose about the binary, not a command
                            break;
                        }
                        wrong.push(format!(
                            "{}: `{span}`: no subcommand {}",
                            file.display(),
                            words[i]
                        ));
                        break;
                    }
                    paths = paths
                        .iter()
                        .flat_map(|p| {
                            alternatives.iter().map(move |a| {
                                let mut q = p.clone();
                                q.push(a.clone());
                                q
                            })
                        })
                        .collect();
                    i += 1;
                }
                for path in &paths {
                    let h = help(&mut cache, binary, path);
                    checked += 1;
                    for w in &words[i..] {
                        for flag in w.split(['[', ']', '|', '=', ',', ')', '(']) {
                            let flag = flag.trim_end_matches(['.', ':', ';']);
                            if flag.starts_with("--") && flag.len() > 2 && !h.contains(flag) {
                                wrong.push(format!(
                                    "{}: `{span}`: {binary} {} has no {flag}",
                                    file.display(),
                                    path.join(" ")
                                ));
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(checked > 80, "only {checked} documented commands found");
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The files whose header comments write commands for a user to run.
fn commented_files(root: &Path) -> Vec<std::path::PathBuf> {
    let mut files = vec![root.join("Containerfile")];
    for (dir, exts) in [
        ("scripts", &["sh"][..]),
        ("bench", &["sh", "py"]),
        ("slurm", &["sh", "yaml", "sbatch"]),
        ("enroot", &["sh", "env"]),
        ("configs", &["yaml"]),
        (".github/workflows", &["yml"]),
    ] {
        let Ok(entries) = std::fs::read_dir(root.join(dir)) else {
            continue;
        };
        let mut found: Vec<_> = entries
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| exts.iter().any(|e| x == *e)))
            .collect();
        found.sort();
        files.extend(found);
    }
    files
}

/// The `#` comment lines of a file, the marker stripped, a line ending in `\` joined with
/// the next (a command written over several lines).
fn comment_text(source: &str) -> String {
    let mut out = String::new();
    for line in source.lines() {
        let t = line.trim_start();
        let Some(c) = t.strip_prefix('#') else {
            continue;
        };
        if c.starts_with('!') {
            continue; // the shebang
        }
        let c = c.trim();
        match c.strip_suffix('\\') {
            Some(joined) => {
                out.push_str(joined.trim_end());
                out.push(' ');
            }
            None => {
                out.push_str(c);
                out.push('\n');
            }
        }
    }
    out
}
