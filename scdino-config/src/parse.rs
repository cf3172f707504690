//! Reading a YAML file into its schema, strictly. The run config and the launcher's
//! `cluster.yaml` are read the same way (an empty file is the defaults; syntax, type and
//! unknown-key errors name the file, line and column), so both use this one helper; each
//! file's error type takes an [`Unparsed`] through `From`.
use serde::de::DeserializeOwned;

/// A file that is not its schema: the message carries line, column and a snippet.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{origin}: {message}")]
pub struct Unparsed {
    /// The file (or `<stdin>`) the text came from.
    pub origin: String,
    pub message: String,
}

/// `text` as a `T`; blank text is `T::default()` (a file that sets nothing).
pub fn parse_yaml<T: DeserializeOwned + Default>(text: &str, origin: &str) -> Result<T, Unparsed> {
    if text.trim().is_empty() {
        return Ok(T::default());
    }
    serde_saphyr::from_str(text).map_err(|e| Unparsed {
        origin: origin.to_string(),
        message: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Default, PartialEq, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct File {
        #[serde(default)]
        n: u32,
    }

    #[test]
    fn blank_is_the_defaults_and_errors_name_file_and_line() {
        assert_eq!(parse_yaml::<File>(" \n", "f.yaml"), Ok(File::default()));
        assert_eq!(parse_yaml::<File>("n: 3\n", "f.yaml"), Ok(File { n: 3 }));
        let e = parse_yaml::<File>("n: 3\nm: 4\n", "f.yaml").unwrap_err();
        assert_eq!(e.origin, "f.yaml");
        let text = e.to_string();
        assert!(
            text.starts_with("f.yaml: ") && text.contains("line 2"),
            "{text}"
        );
    }
}
