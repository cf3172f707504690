//! `.dockerignore` as the Docker CLI reads it (moby/patternmatcher): one pattern per line,
//! `#` comments, `!` re-includes, paths relative to the context root whatever their leading
//! `/`, `*`/`?`/`[...]` within one path segment, `**` across segments, the last matching line
//! wins, and a pattern that matches a folder also matches everything below it.
use globset::{Glob, GlobBuilder, GlobMatcher};
use std::path::Path;

#[derive(Debug, thiserror::Error)]
#[error("{file}:{line}: invalid pattern `{pattern}`: {message}")]
pub struct IgnoreError {
    pub file: String,
    pub line: usize,
    pub pattern: String,
    pub message: String,
}

struct Rule {
    matcher: GlobMatcher,
    exclude: bool,
}

/// The rules of one `.dockerignore` (empty when the file does not exist).
#[derive(Default)]
pub struct DockerIgnore {
    rules: Vec<Rule>,
}

impl DockerIgnore {
    pub fn parse(text: &str, origin: &str) -> Result<Self, IgnoreError> {
        let mut rules = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (exclude, pat) = match line.strip_prefix('!') {
                Some(rest) => (false, rest.trim()),
                None => (true, line),
            };
            let cleaned = clean(pat);
            if cleaned.is_empty() {
                continue;
            }
            let glob: Glob = GlobBuilder::new(&cleaned)
                .literal_separator(true)
                .backslash_escape(true)
                .build()
                .map_err(|e| IgnoreError {
                    file: origin.to_string(),
                    line: i + 1,
                    pattern: pat.to_string(),
                    message: e.kind().to_string(),
                })?;
            rules.push(Rule {
                matcher: glob.compile_matcher(),
                exclude,
            });
        }
        Ok(Self { rules })
    }

    /// Reads `ROOT/.dockerignore`; no file means nothing is ignored.
    pub fn load(root: &Path) -> Result<Self, crate::image::ImageError> {
        let path = root.join(".dockerignore");
        match std::fs::read_to_string(&path) {
            Ok(text) => Ok(Self::parse(&text, &path.display().to_string())?),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Self::default()),
            Err(source) => Err(crate::image::ImageError::Io {
                path: path.clone(),
                source,
            }),
        }
    }

    /// Whether `rel` (slash-separated, relative to the root) stays out of the context.
    pub fn is_excluded(&self, rel: &str) -> bool {
        let mut excluded = false;
        for rule in &self.rules {
            if rule.exclude == excluded {
                continue; // cannot change the outcome
            }
            if matches_self_or_parent(&rule.matcher, rel) {
                excluded = rule.exclude;
            }
        }
        excluded
    }

    /// Whether some `!` rule could re-include a path below an excluded folder, in which case
    /// the walk has to descend into it (as the Docker CLI does).
    pub fn has_exceptions(&self) -> bool {
        self.rules.iter().any(|r| !r.exclude)
    }
}

fn matches_self_or_parent(m: &GlobMatcher, rel: &str) -> bool {
    if m.is_match(rel) {
        return true;
    }
    let mut end = rel.len();
    while let Some(i) = rel[..end].rfind('/') {
        if m.is_match(&rel[..i]) {
            return true;
        }
        end = i;
    }
    false
}

/// Go's `filepath.Clean` for patterns, minus the leading `/` (patterns are root-relative).
fn clean(p: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for seg in p.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            s => parts.push(s),
        }
    }
    parts.join("/")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ig(text: &str) -> DockerIgnore {
        DockerIgnore::parse(text, ".dockerignore").unwrap()
    }

    #[test]
    fn folders_exclude_their_contents_and_leading_slash_is_root() {
        let d = ig("# comment\n/target\n.venv/\n\n");
        assert!(d.is_excluded("target"));
        assert!(d.is_excluded("target/release/trainer"));
        assert!(d.is_excluded(".venv/lib/x.so"));
        assert!(!d.is_excluded("trainer/src/target.rs"));
        assert!(!d.is_excluded("sub/target")); // root-relative, unlike .gitignore
    }

    #[test]
    fn star_stays_in_one_segment_and_double_star_crosses() {
        let d = ig("*.pyc\n**/__pycache__\ndocs/*/draft.md\n");
        assert!(d.is_excluded("a.pyc"));
        assert!(!d.is_excluded("bench/a.pyc")); // `*` does not cross `/`
        assert!(d.is_excluded("bench/__pycache__/x.cpython.pyc"));
        assert!(d.is_excluded("__pycache__"));
        assert!(d.is_excluded("docs/a/draft.md"));
        assert!(!d.is_excluded("docs/a/b/draft.md"));
    }

    #[test]
    fn last_match_wins_and_exceptions_reinclude() {
        let d = ig("target\n!target/release/trainer\n");
        assert!(d.is_excluded("target/debug/x"));
        assert!(!d.is_excluded("target/release/trainer"));
        assert!(d.has_exceptions());
        let d = ig("!keep.txt\n*.txt\n");
        assert!(d.is_excluded("keep.txt"));
    }

    #[test]
    fn bad_pattern_names_file_and_line() {
        let e = DockerIgnore::parse("ok\n[unclosed\n", "ctx/.dockerignore")
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.starts_with("ctx/.dockerignore:2: invalid pattern `[unclosed`"),
            "{e}"
        );
    }
}
