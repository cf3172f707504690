//! The commands the documentation writes (README.md, docs/*.md, slurm/README.md), the header
//! comments of the files a user reads first (Containerfile, scripts/, bench/, slurm/, enroot/,
//! configs/, the CI workflows) and the shell those files run: every `trainer …` / `launcher …`
//! names subcommands that exist and only flags those subcommands take, checked against the
//! binaries' own `--help`, so a renamed command or flag cannot leave them behind.
//!
//! Where a command is found:
//! - in Markdown, a backticked span, every line of a ```` ```bash ```` / ```` ```sh ```` block
//!   and every `$ ` line of an untagged (transcript) block, `\` continuations joined; other
//!   blocks (Python, YAML) are not shell;
//! - in a `#` comment, a line that runs one (`#   launcher image build --tag …`), continuation
//!   lines joined;
//! - in the shell of scripts, sbatch files, the Containerfile and the CI files, every command,
//!   heredoc bodies and comments left out.
//!
//! The binary is written `trainer`, as a path (`./target/release/trainer`,
//! `/opt/scdino/bin/trainer`) or as a shell variable the same file sets to such a path
//! (`T=target/release/trainer` … `"$T" synth`). A flag must be one the subcommand's `--help`
//! lists, exactly: `--chec` is no `--checkpoint`; `--flag=value` is checked as `--flag`, and
//! a short flag `-c` as itself.
use super::util::{bin, text};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;

const BINARIES: [&str; 2] = ["trainer", "launcher"];

/// How sure the place a command was found in makes it that the words are a command.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    /// At a shell command position, or a backticked span that starts with the binary: it must
    /// be a valid command.
    Command,
    /// A comment line that starts with the binary: a command when a subcommand or a flag
    /// follows, prose ("trainer refuses to start …") otherwise.
    Prose,
    /// The binary as an argument of another command (`srun … /opt/scdino/bin/trainer train`,
    /// `cargo build -p trainer --features nccl`): a command only when a subcommand follows.
    Embedded,
}

/// A command found: its words, the first `trainer` or `launcher` whatever way the file wrote
/// the binary, and the text it was found in.
#[derive(Debug, Clone, PartialEq)]
struct Found {
    words: Vec<String>,
    kind: Kind,
    text: String,
}

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

/// The flags a `--help` defines: the `-c, --config <CONFIG>` heads of its option lines and
/// clap's `[aliases: …]`, not flags its prose mentions.
fn flags(help: &str) -> HashSet<String> {
    let mut out = HashSet::new();
    for line in help.lines() {
        let t = line.trim_start();
        if t.starts_with('-') {
            for w in t.split_whitespace() {
                let name = w.trim_end_matches(',').split(['=', '[', '<']).next();
                match name {
                    Some(n) if n.starts_with('-') && n.len() > 1 => out.insert(n.to_string()),
                    _ => break,
                };
            }
        }
        if let Some((_, aliases)) = line.split_once("aliases: ") {
            for a in aliases.split(']').next().unwrap_or("").split(',') {
                let a = a.trim();
                if a.starts_with('-') {
                    out.insert(a.to_string());
                } else if !a.is_empty() {
                    out.insert(format!("-{a}")); // [short aliases: c]
                }
            }
        }
    }
    out
}

/// The flag a piece of a word names: `--name` whole, `-c` (or `-c4`) as `-c`; none for
/// `--`, `-`, `-1`.
fn flag_name(piece: &str) -> Option<&str> {
    let piece = piece.trim_end_matches(['.', ':', ';', '…', '\\']);
    let mut chars = piece.chars();
    match (chars.next(), chars.next(), chars.next()) {
        (Some('-'), Some('-'), Some(c)) if c.is_ascii_alphanumeric() => Some(piece),
        (Some('-'), Some(c), _) if c.is_ascii_alphabetic() => Some(&piece[..2]),
        _ => None,
    }
}

/// `NAME=…`, a shell assignment.
fn is_assignment(word: &str) -> bool {
    let Some((name, _)) = word.split_once('=') else {
        return false;
    };
    name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The binary a path names: `trainer`, `./target/release/trainer`, `$ROOT/…/launcher`.
fn path_binary(path: &str) -> Option<&'static str> {
    let last = path.rsplit('/').next()?;
    BINARIES.into_iter().find(|b| *b == last)
}

/// The binary a shell word names: a path to it (quotes and parentheses around it dropped) or
/// `$VAR` / `${VAR}` / `"$VAR"` that `vars` maps to it.
fn binary_of(word: &str, vars: &HashMap<String, &'static str>) -> Option<&'static str> {
    let w = word
        .trim_start_matches(['(', '"', '\''])
        .trim_end_matches(['"', '\'', ')', ';']);
    if is_assignment(w) {
        return None;
    }
    if !w.contains('/') {
        if let Some(name) = w.strip_prefix('$') {
            let name = name.trim_start_matches('{').trim_end_matches('}');
            return vars.get(name).copied();
        }
    }
    path_binary(w)
}

/// The shell variables a text sets to a binary: `T=target/release/trainer`,
/// `L=$ROOT/target/release/launcher T=…`, `export TRAINER=$(realpath "${TRAINER:-…/trainer}")`.
fn binary_vars(text: &str) -> HashMap<String, &'static str> {
    let mut vars = HashMap::new();
    for line in text.lines() {
        for (i, _) in line.match_indices('=') {
            let before = &line[..i];
            let start = before
                .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .map_or(0, |j| j + 1);
            let name = &before[start..];
            let opens_word = start == 0 || before[..start].ends_with([' ', '\t', ';', '(', '`']);
            if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) || !opens_word {
                continue;
            }
            let value = &line[i + 1..];
            // A command substitution runs to the end of the line; a plain value is one word.
            let value = if value.starts_with("$(") || value.starts_with("\"$(") {
                value.split(" #").next().unwrap_or("")
            } else {
                value.split_whitespace().next().unwrap_or("")
            };
            let value = value
                .trim_end()
                .trim_end_matches(['"', '\'', ')', '}', ';', '`']);
            if let Some(b) = path_binary(value) {
                vars.insert(name.to_string(), b);
            }
        }
    }
    vars
}

/// A shell line split into its simple commands at `&&`, `||`, `|`, `;`, `&`, `$(`, and a
/// `(` or `{` that opens one; words split at whitespace (quotes are not parsed: a quoted
/// string's words are words).
fn simple_commands(line: &str) -> Vec<Vec<String>> {
    let mut out: Vec<Vec<String>> = vec![vec![]];
    for token in line.split_whitespace() {
        let mut token = token;
        while let Some(at) = token.find("$(") {
            if at > 0 {
                out.last_mut().unwrap().push(token[..at].to_string());
            }
            out.push(vec![]);
            token = &token[at + 2..];
        }
        if out.last().unwrap().is_empty() {
            token = token.trim_start_matches('(');
        }
        match token {
            "" => {}
            "&&" | "||" | "|" | ";" | "&" | "|&" | "{" | "}" | ";;" => out.push(vec![]),
            _ => match token.strip_suffix(';') {
                Some(t) => {
                    if !t.is_empty() {
                        out.last_mut().unwrap().push(t.to_string());
                    }
                    out.push(vec![]);
                }
                None => out.last_mut().unwrap().push(token.to_string()),
            },
        }
    }
    out.retain(|c| !c.is_empty());
    out
}

/// The `trainer` / `launcher` commands of a shell line: a binary at the command position
/// (after `VAR=value`s, `exec`, `time`, `timeout N`, `RUN`, …) is a [`Kind::Command`], one
/// further on an [`Kind::Embedded`] one.
fn shell_commands(line: &str, vars: &HashMap<String, &'static str>) -> Vec<Found> {
    let mut out = vec![];
    for simple in simple_commands(line) {
        let mut pos = 0;
        while let Some(w) = simple.get(pos) {
            if is_assignment(w)
                || matches!(
                    w.as_str(),
                    "exec"
                        | "time"
                        | "nohup"
                        | "env"
                        | "sudo"
                        | "command"
                        | "then"
                        | "do"
                        | "else"
                        | "if"
                        | "while"
                        | "until"
                        | "!"
                        | "RUN"
                        | "-"
                        | "$"
                )
            {
                pos += 1;
            } else if w == "timeout" {
                pos += 1;
                while simple.get(pos).is_some_and(|a| a.starts_with('-')) {
                    pos += 1;
                }
                pos += 1; // the duration
            } else {
                break;
            }
        }
        let Some(at) = simple.iter().position(|w| binary_of(w, vars).is_some()) else {
            continue;
        };
        let mut words = vec![binary_of(&simple[at], vars).unwrap().to_string()];
        // Quotes around a word are the shell's, not the command's (`fail "launcher image
        // build"`, `"${args[@]}"`).
        words.extend(
            simple[at + 1..]
                .iter()
                .map(|w| w.trim_matches(['"', '\'']).to_string()),
        );
        let kind = if at == pos {
            Kind::Command
        } else {
            Kind::Embedded
        };
        out.push(Found {
            words,
            kind,
            text: simple.join(" "),
        });
    }
    out
}

/// Lines with a `\` continuation joined to the next.
fn join_continuations<'a>(lines: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let mut out = vec![];
    let mut acc = String::new();
    for line in lines {
        match line.trim_end().strip_suffix('\\') {
            Some(head) => {
                acc.push_str(head.trim_end());
                acc.push(' ');
            }
            None => {
                acc.push_str(line.trim_end());
                out.push(std::mem::take(&mut acc));
            }
        }
    }
    if !acc.is_empty() {
        out.push(acc);
    }
    out
}

/// A shell line without its comment: from a `#` that opens a word outside quotes.
fn strip_shell_comment(line: &str) -> (&str, &str) {
    let (mut single, mut double) = (false, false);
    let mut prev = ' ';
    for (i, c) in line.char_indices() {
        match c {
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            '#' if !single && !double && prev.is_whitespace() => {
                return (&line[..i], &line[i + 1..]);
            }
            _ => {}
        }
        prev = c;
    }
    (line, "")
}

/// The commands of a backticked span: shell, a binary at its command position a command.
fn span_commands(span: &str, vars: &HashMap<String, &'static str>) -> Vec<Found> {
    shell_commands(span, vars)
}

/// The commands of a comment's text (`comment_text`): its backticked spans, and each line
/// where the binary opens the comment or follows a colon (`usage: trainer …`).
fn comment_commands(comments: &str, vars: &HashMap<String, &'static str>) -> Vec<Found> {
    let mut out = vec![];
    for span in comments.split('`').skip(1).step_by(2) {
        out.extend(span_commands(span, vars));
    }
    for line in comments.lines() {
        let plain: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
        let starts = std::iter::once(0).chain(plain.match_indices(": ").map(|(i, _)| i + 2));
        for start in starts {
            let words: Vec<&str> = plain[start..]
                .split_whitespace()
                .skip_while(|w| is_assignment(w))
                .collect();
            let Some(binary) = words.first().and_then(|w| binary_of(w, vars)) else {
                continue;
            };
            let mut found = vec![binary.to_string()];
            found.extend(words[1..].iter().map(|w| w.to_string()));
            out.push(Found {
                words: found,
                kind: Kind::Prose,
                text: plain[start..].trim().to_string(),
            });
        }
    }
    out
}

/// The commands of a Markdown page: backticked spans of its prose, every line of its
/// `bash`/`sh` blocks (and the backticked spans of their comments), the `$ ` lines of its
/// untagged or `console` blocks. The binary's variables are those the page sets anywhere.
fn markdown_commands(doc: &str) -> Vec<Found> {
    let vars = binary_vars(doc);
    let mut out = vec![];
    let mut prose = String::new();
    let mut block: Option<(String, Vec<&str>)> = None;
    for line in doc.lines() {
        let fence = line.trim_start().strip_prefix("```");
        match (block.take(), fence) {
            (None, Some(info)) => {
                let lang = info.split_whitespace().next().unwrap_or("").to_string();
                block = Some((lang, vec![]));
            }
            (None, None) => {
                prose.push_str(line);
                prose.push('\n');
            }
            (Some((lang, lines)), Some(_)) => out.extend(block_commands(&lang, &lines, &vars)),
            (Some((lang, mut lines)), None) => {
                lines.push(line);
                block = Some((lang, lines));
            }
        }
    }
    for span in prose.split('`').skip(1).step_by(2) {
        out.extend(span_commands(span, &vars));
    }
    out
}

/// The commands of a fenced block whose info string starts with `lang`.
fn block_commands(lang: &str, lines: &[&str], vars: &HashMap<String, &'static str>) -> Vec<Found> {
    let shell = matches!(lang, "bash" | "sh" | "shell" | "zsh");
    let transcript = matches!(lang, "" | "console" | "text" | "shell-session");
    if !shell && !transcript {
        return vec![];
    }
    let mut out = vec![];
    for line in join_continuations(lines.iter().copied()) {
        let t = line.trim_start();
        let code = match t.strip_prefix("$ ") {
            Some(c) => c,
            None if shell => t,
            None => continue,
        };
        let (code, comment) = strip_shell_comment(code);
        out.extend(shell_commands(code, vars));
        for span in comment.split('`').skip(1).step_by(2) {
            out.extend(span_commands(span, vars));
        }
    }
    out
}

/// The shell lines of a script (continuations joined, comments and heredoc bodies left out).
fn shell_lines(source: &str) -> Vec<String> {
    let mut out = vec![];
    let mut heredoc: Option<String> = None;
    let mut lines = vec![];
    for line in source.lines() {
        if let Some(end) = &heredoc {
            if line.trim() == end {
                heredoc = None;
            }
            continue;
        }
        lines.push(line);
        // `<<EOF`, `<<-'EOF'`, `<< "EOF"`; not `<<<`.
        if let Some((_, rest)) = line.split_once("<<").filter(|(_, r)| !r.starts_with('<')) {
            let word: String = rest
                .trim_start_matches('-')
                .trim_start()
                .trim_start_matches(['\'', '"'])
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if word.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') {
                heredoc = Some(word);
            }
        }
    }
    for line in join_continuations(lines) {
        let (code, _) = strip_shell_comment(&line);
        if !code.trim().is_empty() {
            out.push(code.to_string());
        }
    }
    out
}

/// The shell of a file that runs commands: scripts and sbatch files whole, the Containerfile's
/// lines (`RUN` a prefix), the lines of a CI file (`*.yml`; `- ` and `run:` heads dropped).
/// Config YAML (`*.yaml`) and Python are not shell.
fn file_shell_commands(path: &Path, source: &str) -> Vec<Found> {
    let vars = binary_vars(source);
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
    let lines: Vec<String> = match ext {
        "sh" | "sbatch" | "" => shell_lines(source),
        "yml" => shell_lines(source)
            .into_iter()
            .map(|l| {
                let t = l.trim_start().trim_start_matches("- ");
                let t = t.strip_prefix("run:").unwrap_or(t);
                t.trim_start_matches(['\'', '"', ' ']).to_string()
            })
            .collect(),
        _ => vec![],
    };
    lines
        .iter()
        .flat_map(|l| shell_commands(l, &vars))
        .collect()
}

/// A placeholder where a subcommand would be: `<stage>`, `…`, `...`, `$VAR`, `"${args[@]}"`.
fn is_placeholder(word: &str) -> bool {
    ["<", "..", "…", "$", "\"$", "'$"]
        .iter()
        .any(|p| word.starts_with(p))
}

/// Checks one command against the binaries' help (`help(binary, subcommand path)`): the
/// number of (binary, subcommand) pairs checked and what is wrong.
fn check(found: &Found, help: &mut dyn FnMut(&str, &[String]) -> String) -> (usize, Vec<String>) {
    let all: Vec<&str> = found.words.iter().map(String::as_str).collect();
    let binary = all[0];
    let (mut checked, mut wrong) = (0, vec![]);
    if all.len() < 2 || is_placeholder(all[1]) {
        return (0, wrong); // `trainer <stage> …`: a placeholder for any subcommand
    }
    let known = subcommands(&help(binary, &[]));
    let first: Vec<String> = all[1].split('|').map(|a| a.to_string()).collect();
    let opens_with_subcommand = first
        .iter()
        .all(|a| known.contains(&a.trim_end_matches('\\').to_string()));
    match found.kind {
        Kind::Embedded if !opens_with_subcommand => return (0, wrong),
        Kind::Prose if !opens_with_subcommand && !all[1].starts_with('-') => return (0, wrong),
        _ => {}
    }
    // `trainer launch … -- STAGE …` and `launcher run IMAGE … -- STAGE …` run a trainer
    // command: check both.
    let mut commands: Vec<Vec<&str>> = vec![];
    if let Some(at) = all.iter().position(|w| *w == "--") {
        let mut inner = vec!["trainer"];
        inner.extend(&all[at + 1..]);
        commands.push(all[..at].to_vec());
        commands.push(inner);
    } else {
        commands.push(all);
    }
    for words in commands {
        let binary = words[0];
        if words.len() < 2 || is_placeholder(words[1]) {
            continue;
        }
        // Walk the subcommands; `a|b` (or `a\|b` in a table) lists alternatives.
        let mut paths: Vec<Vec<String>> = vec![vec![]];
        let mut i = 1;
        while i < words.len() && !words[i].starts_with('-') && !is_placeholder(words[i]) {
            let alternatives: Vec<String> = words[i]
                .split('|')
                .map(|a| a.trim_end_matches('\\').to_string())
                .collect();
            let known = subcommands(&help(binary, &paths[0]));
            if !alternatives.iter().all(|a| known.contains(a)) {
                if known.is_empty() {
                    break; // a leaf: the rest are arguments
                }
                wrong.push(format!("no subcommand {}", words[i]));
                paths.clear();
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
            let defined = flags(&help(binary, path));
            checked += 1;
            for w in &words[i..] {
                let pieces = w.split(['[', ']', '|', '=', ',', ')', '(', '"', '\'', '{', '}']);
                for flag in pieces.filter_map(flag_name) {
                    if !defined.contains(flag) {
                        let at = std::iter::once(binary.to_string())
                            .chain(path.iter().cloned())
                            .collect::<Vec<_>>()
                            .join(" ");
                        wrong.push(format!("{at} has no {flag}"));
                    }
                }
            }
        }
    }
    (checked, wrong)
}

#[test]
fn documented_commands_exist_with_the_flags_they_are_written_with() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = vec![root.join("README.md"), root.join("slurm/README.md")];
    files.extend(sorted_files(&root.join("docs"), &["md"]));
    let mut found: Vec<(PathBuf, Found)> = vec![];
    for file in &files {
        let doc = std::fs::read_to_string(file).unwrap();
        found.extend(
            markdown_commands(&doc)
                .into_iter()
                .map(|f| (file.clone(), f)),
        );
    }
    for file in commented_files(&root) {
        let source = std::fs::read_to_string(&file).unwrap();
        let vars = binary_vars(&source);
        let mut commands = comment_commands(&comment_text(&source), &vars);
        commands.extend(file_shell_commands(&file, &source));
        found.extend(commands.into_iter().map(|f| (file.clone(), f)));
    }
    let mut cache = HashMap::new();
    let mut help = |binary: &str, path: &[String]| help(&mut cache, binary, path);
    let mut checked = 0;
    let mut wrong = BTreeSet::new();
    for (file, f) in &found {
        let (n, errors) = check(f, &mut help);
        checked += n;
        for e in errors {
            let file = file.strip_prefix(&root).unwrap_or(file).display();
            wrong.insert(format!("{file}: `{}`: {e}", f.text));
        }
    }
    assert!(checked > 300, "only {checked} documented commands found");
    let wrong: Vec<String> = wrong.into_iter().collect();
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The files of `dir` with one of `exts`, sorted.
fn sorted_files(dir: &Path, exts: &[&str]) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return vec![];
    };
    let mut found: Vec<_> = entries
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| exts.iter().any(|e| x == *e)))
        .collect();
    found.sort();
    found
}

/// The files whose header comments write commands for a user to run, and whose shell runs
/// the binaries.
fn commented_files(root: &Path) -> Vec<PathBuf> {
    let mut files = vec![root.join("Containerfile")];
    for (dir, exts) in [
        ("scripts", &["sh"][..]),
        ("bench", &["sh", "py"]),
        ("slurm", &["sh", "yaml", "sbatch"]),
        ("slurm/example", &["sbatch"]),
        ("enroot", &["sh", "env"]),
        ("configs", &["yaml"]),
        (".github/workflows", &["yml"]),
        ("ci", &["yml"]),
    ] {
        files.extend(sorted_files(&root.join(dir), exts));
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

/// The extraction and the matching on small texts, against a made-up `--help`: each way of
/// writing a command is found, and a wrong flag in it is caught.
mod unit {
    use super::*;

    /// A `--help` in clap's layout for `trainer` (`train`, `config check|show`, `launch`) and
    /// `launcher` (`image build`, `run`).
    fn fake_help(binary: &str, path: &[String]) -> String {
        let path: Vec<&str> = path.iter().map(String::as_str).collect();
        let options =
            |flags: &str| format!("Usage: x\n\nOptions:\n{flags}  -h, --help  Print help\n");
        match (binary, path.as_slice()) {
            ("trainer", []) => "Usage: trainer <COMMAND>\n\nCommands:\n  train   Train\n  config  Config\n  launch  Launch\n  help    Help\n\nOptions:\n  -h, --help     Print help\n  -V, --version  Print version\n".into(),
            ("trainer", ["train"]) => options(
                "  -c, --config <CONFIG>     The config\n      --checkpoint <PATH>   A checkpoint (not --resume)\n      --max-steps <N>       Stop after N steps [aliases: --steps]\n",
            ),
            ("trainer", ["config"]) => "Commands:\n  check  Check\n  show  Show\n\nOptions:\n  -h, --help  Print help\n".into(),
            ("trainer", ["config", _]) => options("      --json  JSON\n"),
            ("trainer", ["launch"]) => options("      --nproc <N>  Ranks\n"),
            ("launcher", []) => "Commands:\n  image  Images\n  run  Run\n\nOptions:\n  -h, --help  Print help\n".into(),
            ("launcher", ["image"]) => "Commands:\n  build  Build\n\nOptions:\n  -h, --help  Print help\n".into(),
            ("launcher", ["image", "build"]) => options("      --tag <TAG>  Tag\n      --push  Push\n"),
            ("launcher", ["run"]) => options("      --gpus <GPUS>  GPUs\n"),
            _ => String::new(),
        }
    }

    /// What is wrong with every command found.
    fn wrong(found: &[Found]) -> Vec<String> {
        found
            .iter()
            .flat_map(|f| check(f, &mut fake_help).1)
            .collect()
    }

    fn checked(found: &[Found]) -> usize {
        found.iter().map(|f| check(f, &mut fake_help).0).sum()
    }

    #[test]
    fn flags_match_exactly() {
        let help = fake_help("trainer", &["train".into()]);
        // A substring test against the help would pass a truncated flag: `--chec` is in it.
        assert!(help.contains("--chec") && help.contains("--conf"));
        let defined = flags(&help);
        let want: HashSet<String> = [
            "-c",
            "--config",
            "--checkpoint",
            "--max-steps",
            "--steps",
            "-h",
            "--help",
        ]
        .map(String::from)
        .into();
        assert_eq!(defined, want);
        let span = |s: &str| wrong(&span_commands(s, &HashMap::new()));
        assert!(span("trainer train --config x.yaml --checkpoint c -c y").is_empty());
        assert!(span("trainer train --config=x.yaml --max-steps=3 --steps 2").is_empty());
        // A truncated flag is contained in a real one, and in the help text: still wrong.
        assert_eq!(
            span("trainer train --chec c"),
            ["trainer train has no --chec"]
        );
        assert_eq!(
            span("trainer train --conf=x.yaml"),
            ["trainer train has no --conf"]
        );
        // Mentioned in the help's prose, not defined.
        assert_eq!(
            span("trainer train --resume"),
            ["trainer train has no --resume"]
        );
        assert_eq!(span("trainer train -x 3"), ["trainer train has no -x"]);
        assert_eq!(span("trainer train -C"), ["trainer train has no -C"]);
        assert_eq!(span("trainer --versio"), ["trainer has no --versio"]);
        assert!(span("trainer --version").is_empty());
        assert_eq!(span("trainer trian"), ["no subcommand trian"]);
        assert_eq!(
            span("trainer config check\\|show --jsn"),
            [
                "trainer config check has no --jsn",
                "trainer config show has no --jsn"
            ]
        );
        // After `--`, a trainer command.
        assert_eq!(
            span("trainer launch --nproc 2 -- train --chekpoint c"),
            ["trainer train has no --chekpoint"]
        );
        assert_eq!(
            span("launcher run img --gpus all -- trian"),
            ["no subcommand trian"]
        );
    }

    #[test]
    fn fenced_shell_blocks_are_commands_and_python_blocks_are_not() {
        let doc = "Prose about the trainer train step.\n\n```bash\n# a comment: `trainer train --confg x`\ntrainer train --config x.yaml \\\n    --max-stps 3\ncargo build -p trainer --features nccl\n```\n\n```sh\nscripts/setup.sh && trainer trian\n```\n\n```python\nsubprocess.run(['trainer', 'train', '--bogus'])\ntrainer train --bogus\n```\n\n```\n$ launcher image build --tag t --psh\nlauncher image build output line --not-a-flag\n```\n";
        let found = markdown_commands(doc);
        assert_eq!(
            wrong(&found),
            [
                "trainer train has no --confg",
                "trainer train has no --max-stps",
                "no subcommand trian",
                "launcher image build has no --psh",
            ]
        );
        // The same lines, written right, pass.
        let right = doc
            .replace("--confg", "--config")
            .replace("--max-stps", "--max-steps")
            .replace("trian", "train")
            .replace("--psh", "--push");
        let found = markdown_commands(&right);
        assert_eq!(wrong(&found), Vec::<String>::new());
        assert_eq!(checked(&found), 4);
    }

    #[test]
    fn binaries_written_as_paths_and_variables_are_found() {
        let doc = "```bash\n./scripts/setup.sh && ./target/release/trainer train --confg a\nL=./target/release/launcher\n$L image build --tg t\n```\n\n```bash\ntarget/release/trainer train --max-step 3\n```\n";
        assert_eq!(
            wrong(&markdown_commands(doc)),
            [
                "trainer train has no --confg",
                "launcher image build has no --tg",
                "trainer train has no --max-step",
            ]
        );
        let script = "#!/bin/bash\n# usage: bench/x.sh OUT\nTRAINER=$ROOT/target/release/trainer\nexport T2=$(realpath \"${T2:-$ROOT/target/device/trainer}\")\nL=$ROOT/target/release/launcher T=$ROOT/target/release/trainer\n\"$TRAINER\" train --config \"$y\" --chekpoint \"$c\" >>\"$log\" 2>&1\ntimeout 100 \"$T2\" train --max-steps 3 && \"$T\" trian\nsq=$(\"$L\" image build --tag x --pus 2>/dev/null)\ncat <<EOF >x.yaml\n\"$TRAINER\" train --in-a-heredoc\nEOF\nsrun --kill-on-bad-exit=1 \\\n  /opt/scdino/bin/trainer train \\\n  --conifg x &\ncp \"$TRAINER\" \"$W/bin/trainer\"\ncargo build --release -p trainer --features nccl\necho \"trainer --version: $v\"\nfail \"launcher image build\"\n\"${TRAINER}\" train \"${args[@]}\" --steps 2 # --not-checked\n";
        let found = file_shell_commands(Path::new("bench/x.sh"), script);
        assert_eq!(
            wrong(&found),
            [
                "trainer train has no --chekpoint",
                "no subcommand trian",
                "launcher image build has no --pus",
                "trainer train has no --conifg",
            ]
        );
        assert_eq!(checked(&found), 6);
        let vars = binary_vars(script);
        assert_eq!(vars.get("TRAINER"), Some(&"trainer"));
        assert_eq!(vars.get("T2"), Some(&"trainer"));
        assert_eq!(vars.get("L"), Some(&"launcher"));
        assert_eq!(vars.get("T"), Some(&"trainer"));
        assert_eq!(vars.len(), 4);
    }

    #[test]
    fn comment_lines_are_commands_where_they_start_with_the_binary() {
        let source = "#!/bin/bash\n# The trainer refuses to start without a config.\n# usage: trainer train --confg x.yaml\n#   launcher image build --tag t \\\n#     --psh\n# Run `./target/release/trainer train --max-stps 1` first.\nT=target/release/trainer\n#   $T train --chekpoint c\n";
        let found = comment_commands(&comment_text(source), &binary_vars(source));
        assert_eq!(
            wrong(&found),
            [
                "trainer train has no --max-stps",
                "trainer train has no --confg",
                "launcher image build has no --psh",
                "trainer train has no --chekpoint",
            ]
        );
    }

    #[test]
    fn shell_words_split_into_simple_commands() {
        assert_eq!(
            simple_commands("t0=$(secs); \"$L\" image build --x | tee y && (cd w && \"$T\" z)"),
            [
                vec!["t0="],
                vec!["secs)"],
                vec!["\"$L\"", "image", "build", "--x"],
                vec!["tee", "y"],
                vec!["cd", "w"],
                vec!["\"$T\"", "z)"],
            ]
        );
        assert_eq!(
            strip_shell_comment("a '#b' \"#c\" ${#d} # e"),
            ("a '#b' \"#c\" ${#d} ", " e")
        );
        assert_eq!(flag_name("--out…"), Some("--out"));
        assert_eq!(flag_name("-n4"), Some("-n"));
        assert_eq!(flag_name("--"), None);
        assert_eq!(flag_name("-1"), None);
    }
}
