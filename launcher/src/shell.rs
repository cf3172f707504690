//! The one place that quotes values for the shell. Every value written into a generated
//! script goes through [`quote`], so paths with spaces, quotes or `$` stay literal.

/// POSIX single-quote quoting: `it's` → `'it'\''s'`. Plain words are left bare for readability.
pub fn quote(value: &str) -> String {
    let plain = !value.is_empty()
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./:=@%+,".contains(&b));
    if plain {
        value.to_string()
    } else {
        format!("'{}'", value.replace('\'', r"'\''"))
    }
}

/// Quotes each word and joins them into one command line.
pub fn join<I, S>(words: I) -> String
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    words
        .into_iter()
        .map(|w| quote(w.as_ref()))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// The shell must hand back exactly the words we quoted.
    #[test]
    fn sh_reads_back_every_value_literally() {
        let words = [
            "plain",
            "",
            "with space",
            "it's",
            "\"double\"",
            "$HOME `id` $(id)",
            "back\\slash",
            "new\nline",
            "glob*?[a]",
            "semi;colon && echo pwned",
            "ünïcödé",
            "-dash",
        ];
        let script = format!("printf '%s\\0' {}", join(words));
        let out = Command::new("sh").arg("-c").arg(&script).output().unwrap();
        assert!(out.status.success());
        let mut got: Vec<String> = out
            .stdout
            .split(|b| *b == 0)
            .map(|s| String::from_utf8(s.to_vec()).unwrap())
            .collect();
        assert_eq!(got.pop().as_deref(), Some(""), "output ends with a NUL");
        assert_eq!(got, words);
        assert_eq!(quote(""), "''");
        assert_eq!(quote("a/b.c"), "a/b.c");
        assert_eq!(quote("it's"), r"'it'\''s'");
    }
}
