//! Finds the line of a dotted key (`train.lr`, `slurm.nodes`) in YAML source, so that a value
//! that parses but fails validation is reported where the user wrote it. Its own crate because
//! both the trainer and the launcher need it and the launcher must not link the trainer
//! (libtorch).
use serde_saphyr::granit_parser::{Event, Parser};
use std::collections::HashMap;

/// Dotted key path → 1-based line of the key. Built once per file; keys inside sequences are
/// indexed as `list[3].key`.
#[derive(Debug, Default, Clone)]
pub struct KeyLines {
    lines: HashMap<String, usize>,
}

enum Frame {
    Map {
        path: String,
        expect_key: bool,
        key: Option<String>,
    },
    Seq {
        path: String,
        index: usize,
    },
}

impl KeyLines {
    /// Never fails: unparseable YAML yields an empty map (the deserializer reports the syntax error).
    pub fn scan(source: &str) -> Self {
        let mut lines = HashMap::new();
        let mut stack: Vec<Frame> = Vec::new();
        for item in Parser::new_from_str(source) {
            let Ok((event, span)) = item else { break };
            let line = span.start.line();
            // The path at which a new node (scalar or collection) sits, and whether it is a key.
            let (node_path, is_key) = match stack.last_mut() {
                Some(Frame::Map {
                    path,
                    expect_key,
                    key,
                }) => {
                    if *expect_key {
                        (path.clone(), true)
                    } else {
                        let k = key.clone().unwrap_or_default();
                        (join(path, &k), false)
                    }
                }
                Some(Frame::Seq { path, index }) => (format!("{path}[{index}]"), false),
                None => (String::new(), false),
            };
            match event {
                Event::Scalar(value, ..) => {
                    if is_key {
                        let full = join(&node_path, &value);
                        lines.entry(full).or_insert(line);
                        if let Some(Frame::Map {
                            expect_key, key, ..
                        }) = stack.last_mut()
                        {
                            *key = Some(value.into_owned());
                            *expect_key = false;
                        }
                    } else {
                        advance(&mut stack);
                    }
                }
                Event::MappingStart(..) => stack.push(Frame::Map {
                    path: node_path,
                    expect_key: true,
                    key: None,
                }),
                Event::SequenceStart(..) => stack.push(Frame::Seq {
                    path: node_path,
                    index: 0,
                }),
                Event::MappingEnd | Event::SequenceEnd => {
                    stack.pop();
                    advance(&mut stack);
                }
                Event::Alias(..) => advance(&mut stack),
                _ => {}
            }
        }
        Self { lines }
    }

    /// The line of `key` when the file writes that very key (not one of its ancestors): tells a
    /// value the user chose from a default.
    pub fn written(&self, key: &str) -> Option<usize> {
        self.lines.get(key).copied()
    }

    /// The line of `key`, or of its closest written ancestor (defaults have no line).
    pub fn line_of(&self, key: &str) -> Option<usize> {
        let mut k = key;
        loop {
            if let Some(l) = self.lines.get(k) {
                return Some(*l);
            }
            let cut = k.rfind(['.', '['])?;
            k = &k[..cut];
        }
    }
}

/// A value finished: the enclosing map now expects a key, the enclosing list moves on.
fn advance(stack: &mut [Frame]) {
    match stack.last_mut() {
        Some(Frame::Map { expect_key, .. }) => *expect_key = true,
        Some(Frame::Seq { index, .. }) => *index += 1,
        None => {}
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_nested_keys_and_list_items() {
        let src = "run:\n  name: x\ntrain:\n  lr: 0.1\n  list:\n    - a: 1\n    - a: 2\n      b: [1, 2]\ndata: {c: 3}\n";
        let k = KeyLines::scan(src);
        assert_eq!(k.line_of("run.name"), Some(2));
        assert_eq!(k.line_of("train.lr"), Some(4));
        assert_eq!(k.line_of("train.list[1].a"), Some(7));
        assert_eq!(k.line_of("train.list[1].b"), Some(8));
        assert_eq!(k.line_of("train.list[1].b[1]"), Some(8));
        assert_eq!(k.line_of("data.c"), Some(9));
        // Unwritten key: falls back to its section.
        assert_eq!(k.line_of("train.epochs"), Some(3));
        assert_eq!(k.line_of("model.arch"), None);
        assert_eq!(k.written("train.lr"), Some(4));
        assert_eq!(k.written("data.c"), Some(9));
        assert_eq!(k.written("train.epochs"), None);
    }
}
