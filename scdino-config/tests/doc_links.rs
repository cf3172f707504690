//! Every relative link of the documentation (README.md, docs/*.md, slurm/README.md,
//! BENCHMARKS.md) points to a file that exists and, with `#anchor`, to a heading of that file,
//! so a renamed page or section cannot leave a dead link behind. Anchors follow GitHub's rule.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn pages() -> Vec<PathBuf> {
    let root = root();
    let mut pages = vec![
        root.join("README.md"),
        root.join("slurm/README.md"),
        root.join("BENCHMARKS.md"),
    ];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

/// The text outside fenced code blocks, line by line.
fn prose(markdown: &str) -> Vec<&str> {
    let mut fenced = false;
    markdown
        .lines()
        .filter(|l| {
            if l.trim_start().starts_with("```") {
                fenced = !fenced;
                return false;
            }
            !fenced
        })
        .collect()
}

/// GitHub's anchor of a heading: lower case, punctuation dropped, spaces as '-'.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a page's headings (a repeated heading gets `-1`, `-2`, ...).
fn anchors(markdown: &str) -> Vec<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = Vec::new();
    for line in prose(markdown) {
        let hashes = line.chars().take_while(|c| *c == '#').count();
        if hashes == 0 || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(&line[hashes..]);
        let n = seen.entry(base.clone()).or_insert(0);
        out.push(if *n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        });
        *n += 1;
    }
    out
}

/// The targets of the inline links `[text](target)` of a page, outside code.
fn links(markdown: &str) -> Vec<String> {
    let text = prose(markdown).join("\n");
    // Code spans (which may wrap lines) hold no links.
    let outside_code: String = text.split('`').step_by(2).collect::<Vec<_>>().join(" ");
    let mut out = Vec::new();
    let mut rest = outside_code.as_str();
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        let end = rest.find(')').unwrap_or(rest.len());
        let target = rest[..end].split_whitespace().next().unwrap_or("");
        out.push(target.trim_matches(['<', '>']).to_string());
        rest = &rest[end..];
    }
    out
}

fn is_external(target: &str) -> bool {
    target.contains("://") || target.starts_with("mailto:")
}

#[test]
fn relative_links_point_to_existing_files_and_headings() {
    let mut checked = 0;
    let mut broken = Vec::new();
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        let dir = page.parent().unwrap();
        for target in links(&text) {
            if target.is_empty() || is_external(&target) {
                continue;
            }
            checked += 1;
            let (path, anchor) = match target.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (target.as_str(), None),
            };
            let file = if path.is_empty() {
                page.clone()
            } else {
                dir.join(path)
            };
            let name = page.strip_prefix(root()).unwrap_or(&page).display();
            if !file.exists() {
                broken.push(format!("{name}: {target}: no such file"));
                continue;
            }
            let Some(anchor) = anchor else { continue };
            if file.extension().is_none_or(|x| x != "md") {
                continue;
            }
            let heads = anchors(&std::fs::read_to_string(&file).unwrap());
            if !heads.iter().any(|h| h == anchor) {
                broken.push(format!("{name}: {target}: no heading with that anchor"));
            }
        }
    }
    assert!(
        checked > 50,
        "only {checked} links found: is the parser broken?"
    );
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn anchors_follow_github() {
    let page = "# Title\n## Collectives benchmark / nccl-test\n```\n# not a heading\n```\n\
                ## Data semantics (scDINO's, except where scDINO gave NaN)\n## Logs\n## Logs\n";
    assert_eq!(
        anchors(page),
        [
            "title",
            "collectives-benchmark--nccl-test",
            "data-semantics-scdinos-except-where-scdino-gave-nan",
            "logs",
            "logs-1"
        ]
    );
    assert_eq!(
        links("see [a](a.md#x) and `[b](not-a-link.md)`, ![i](img.png \"t\")"),
        ["a.md#x", "img.png"]
    );
}

#[test]
fn the_readme_links_every_docs_page_and_stays_short() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let linked = links(&readme);
    for page in pages() {
        if page.parent().is_some_and(|d| d.ends_with("docs")) {
            let name = format!("docs/{}", page.file_name().unwrap().to_string_lossy());
            assert!(
                linked.iter().any(|l| l == &name),
                "README.md's \"Where to go\" table lacks {name}"
            );
        }
    }
    let lines = readme.lines().count();
    assert!(
        lines <= 200,
        "README.md has {lines} lines; keep it under 200"
    );
}
