//! `docs/config-reference.md`: every key of the run config with its default and meaning,
//! generated so that it cannot drift from the code. The keys and meanings are read from the
//! schema's own source (the doc comment above each field of `sections/`, and the values of
//! its enums), the defaults from [`Sections::default`], the keys nothing reads from
//! [`IGNORED_KEYS`]; a test compares the committed page with this rendering.
//!
//! An enum key's values are its enum's variants, which are also exactly what the YAML parse
//! accepts (serde refuses any other spelling), so the page lists what validation accepts; a
//! test loads every listed value to keep a validation rule from refusing one on its own.
use crate::{Sections, IGNORED_KEYS};
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt::Write;

/// The files that declare the schema: the sections, `lib.rs` for the enums kept there, and
/// `dichavit.rs` (`model.dichavit`).
const SCHEMA_SOURCES: [&str; 9] = [
    include_str!("sections/mod.rs"),
    include_str!("sections/run.rs"),
    include_str!("sections/data.rs"),
    include_str!("sections/model.rs"),
    include_str!("sections/train.rs"),
    include_str!("sections/augment.rs"),
    include_str!("sections/downstream.rs"),
    include_str!("lib.rs"),
    include_str!("dichavit.rs"),
];

/// How to regenerate the page after changing the schema (written into its header).
const REGENERATE: &str = "SCDINO_BLESS=1 cargo test -p scdino-config config_reference";

/// A struct of the schema as its source declares it.
#[derive(Debug, Default)]
struct StructDecl {
    doc: String,
    /// (field, type, doc), in declaration order.
    fields: Vec<(String, String, String)>,
}

/// An enum of the schema written in YAML as snake_case words.
#[derive(Debug, Default)]
struct EnumDecl {
    /// (YAML spelling, doc), in declaration order.
    values: Vec<(String, String)>,
}

#[derive(Debug, Default)]
struct Schema {
    structs: BTreeMap<String, StructDecl>,
    enums: BTreeMap<String, EnumDecl>,
}

/// One documented key: `data.object_store.region`, its default as YAML and its meaning.
#[derive(Debug, Clone, PartialEq)]
struct KeyDoc {
    key: String,
    default: String,
    meaning: String,
    /// An enum key's YAML values, in declaration order (empty for other keys).
    values: Vec<String>,
}

fn snake_case(camel: &str) -> String {
    let mut out = String::new();
    for (i, c) in camel.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// Reads the structs and snake_case enums of `sources`, with their doc comments. It relies on
/// rustfmt's layout: one field or variant per line, items closed by `}` in column 0.
fn parse(sources: &[&str]) -> Schema {
    let mut schema = Schema::default();
    for source in sources {
        let mut doc: Vec<String> = Vec::new();
        let mut snake = false;
        // A field's YAML key where `#[serde(rename = "...")]` gives it one.
        let mut renamed: Option<String> = None;
        let mut current_struct: Option<(String, StructDecl)> = None;
        let mut current_enum: Option<(String, EnumDecl)> = None;
        for line in source.lines() {
            let t = line.trim();
            if let Some(d) = t.strip_prefix("///") {
                doc.push(d.trim().to_string());
                continue;
            }
            if t.starts_with("#[") {
                snake |= t.contains("rename_all = \"snake_case\"");
                if let Some(rest) = t.strip_prefix("#[serde(rename = \"") {
                    renamed = rest.split('"').next().map(str::to_string);
                }
                continue;
            }
            if line == "}" {
                if let Some((name, decl)) = current_struct.take() {
                    schema.structs.insert(name, decl);
                }
                if let Some((name, decl)) = current_enum.take() {
                    schema.enums.insert(name, decl);
                }
            } else if let Some(rest) = line.strip_prefix("pub struct ") {
                if let Some(name) = rest.strip_suffix(" {") {
                    let decl = StructDecl {
                        doc: doc.join(" "),
                        fields: Vec::new(),
                    };
                    current_struct = Some((name.to_string(), decl));
                }
            } else if let Some(rest) = line.strip_prefix("pub enum ") {
                if let (Some(name), true) = (rest.strip_suffix(" {"), snake) {
                    current_enum = Some((name.to_string(), EnumDecl::default()));
                }
            } else if let Some((_, decl)) = current_struct.as_mut() {
                if let Some((name, ty)) = t
                    .strip_prefix("pub ")
                    .and_then(|f| f.strip_suffix(','))
                    .and_then(|f| f.split_once(": "))
                {
                    let key = renamed.take().unwrap_or_else(|| name.to_string());
                    decl.fields.push((key, ty.to_string(), doc.join(" ")));
                }
            } else if let Some((_, decl)) = current_enum.as_mut() {
                if let Some(variant) = t.strip_suffix(',') {
                    if variant.chars().all(|c| c.is_ascii_alphanumeric()) {
                        decl.values.push((snake_case(variant), doc.join(" ")));
                    }
                }
            }
            doc.clear();
            renamed = None;
            if !line.starts_with(' ') {
                snake = false;
            }
        }
    }
    schema
}

/// The schema's name of a field's type: `Option<crate::DeviceChoice>` → `DeviceChoice`.
fn type_name(ty: &str) -> &str {
    let ty = ty
        .strip_prefix("Option<")
        .and_then(|t| t.strip_suffix('>'))
        .unwrap_or(ty);
    ty.rsplit("::").next().unwrap_or(ty)
}

/// A default as it would be written in YAML (flow style for lists and maps).
fn yaml(v: &Value, nested: bool) -> String {
    match v {
        Value::Null => "null".into(),
        Value::String(s) if nested || s.is_empty() => format!("{s:?}"),
        Value::String(s) => s.clone(),
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(|i| yaml(i, true)).collect();
            format!("[{}]", items.join(", "))
        }
        Value::Object(map) => {
            let items: Vec<String> = map
                .iter()
                .map(|(k, v)| format!("{k}: {}", yaml(v, true)))
                .collect();
            format!("{{{}}}", items.join(", "))
        }
        other => other.to_string(),
    }
}

/// A section of the page: its dotted path, its doc, and its keys (sub-sections follow).
struct Section {
    path: String,
    doc: String,
    keys: Vec<KeyDoc>,
}

fn collect(
    schema: &Schema,
    ty: &str,
    path: &str,
    doc: &str,
    defaults: &Value,
    out: &mut Vec<Section>,
) {
    let Some(decl) = schema.structs.get(ty) else {
        return;
    };
    let at = out.len();
    out.push(Section {
        path: path.to_string(),
        doc: if decl.doc.is_empty() {
            doc.to_string()
        } else {
            decl.doc.clone()
        },
        keys: Vec::new(),
    });
    for (field, field_ty, field_doc) in &decl.fields {
        let key = if path.is_empty() {
            field.clone()
        } else {
            format!("{path}.{field}")
        };
        let value = &defaults[field.as_str()];
        let inner = type_name(field_ty);
        if schema.structs.contains_key(inner) {
            collect(schema, inner, &key, field_doc, value, out);
            continue;
        }
        let mut meaning = field_doc.clone();
        let mut listed = Vec::new();
        if let Some(e) = schema.enums.get(inner) {
            listed = e.values.iter().map(|(v, _)| v.clone()).collect();
            let values: Vec<String> = e
                .values
                .iter()
                .map(|(v, d)| {
                    if d.is_empty() {
                        format!("`{v}`")
                    } else {
                        format!("`{v}`: {}", d.trim_end_matches('.'))
                    }
                })
                .collect();
            let sep = if e.values.iter().any(|(_, d)| !d.is_empty()) {
                "; "
            } else {
                ", "
            };
            let _ = write!(meaning, " Values: {}.", values.join(sep));
        }
        if let Some(ignored) = IGNORED_KEYS.iter().find(|k| k.key == key) {
            let _ = write!(
                meaning,
                " Accepted for scDINO compatibility and ignored (loading a file that sets it \
                 warns): {}.",
                ignored.instead
            );
        }
        out[at].keys.push(KeyDoc {
            key,
            default: yaml(value, false),
            meaning: meaning.trim().to_string(),
            values: listed,
        });
    }
}

fn sections() -> Vec<Section> {
    let schema = parse(&SCHEMA_SOURCES);
    // An optional section's keys are documented with the defaults they take when it is set.
    let mut with_sections = Sections::default();
    with_sections.data.screen = Some(crate::ScreenSection::default());
    let defaults = serde_json::to_value(with_sections).expect("the default sections serialize");
    let mut out = Vec::new();
    collect(&schema, "Sections", "", "", &defaults, &mut out);
    out.retain(|s| !s.path.is_empty());
    out
}

fn cell(text: &str) -> String {
    text.replace('|', "\\|")
}

/// The reference page as Markdown.
pub fn markdown() -> String {
    let mut md = String::new();
    let _ = write!(
        md,
        "# Configuration reference\n\n\
         <!-- Generated from scdino-config (the doc comments of src/sections/ and the defaults); \
         do not edit. Regenerate: {REGENERATE} -->\n\n\
         Every key of the trainer's run config, with its default and meaning. The page is \
         generated from the config crate, and a test fails when it differs from the code. \
         `trainer config default` prints the same defaults as YAML; \
         [configuration.md](configuration.md) explains the file as a whole and how its keys map \
         to scDINO's. Unknown keys are errors.\n"
    );
    for s in sections() {
        let depth = s.path.matches('.').count();
        let _ = write!(md, "\n{} `{}`\n\n", "#".repeat(2 + depth.min(1)), s.path);
        if !s.doc.is_empty() {
            let _ = write!(md, "{}\n\n", s.doc);
        }
        if s.keys.is_empty() {
            continue;
        }
        md.push_str("| Key | Default | Meaning |\n|---|---|---|\n");
        for k in &s.keys {
            let _ = writeln!(
                md,
                "| `{}` | `{}` | {} |",
                k.key,
                cell(&k.default),
                cell(&k.meaning)
            );
        }
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every key of the run config, in file order.
    fn keys() -> Vec<KeyDoc> {
        sections().into_iter().flat_map(|s| s.keys).collect()
    }

    /// The leaf keys of the defaults as serialized, descending only into sections: what the
    /// parsed source must cover.
    fn serialized_keys(v: &Value, path: &str, sections: &[String], out: &mut Vec<String>) {
        match v {
            Value::Object(map) if path.is_empty() || sections.iter().any(|s| s == path) => {
                for (k, v) in map {
                    let key = if path.is_empty() {
                        k.clone()
                    } else {
                        format!("{path}.{k}")
                    };
                    serialized_keys(v, &key, sections, out);
                }
            }
            _ => out.push(path.to_string()),
        }
    }

    #[test]
    fn every_key_is_documented_with_its_default() {
        let documented = keys();
        let section_paths: Vec<String> = sections().into_iter().map(|s| s.path).collect();
        let mut serialized = Vec::new();
        // A key left out when unset (so recorded configs stay as they were) counts when set.
        let mut with_all = Sections::default();
        with_all.model.img_size = Some(crate::ModelSection::DEFAULT_IMG_SIZE);
        with_all.data.screen = Some(crate::ScreenSection::default());
        let defaults = serde_json::to_value(with_all).unwrap();
        serialized_keys(&defaults, "", &section_paths, &mut serialized);
        let mut listed: Vec<String> = documented.iter().map(|k| k.key.clone()).collect();
        listed.sort();
        serialized.sort();
        assert_eq!(
            listed, serialized,
            "the parsed schema misses or invents keys"
        );
        let undocumented: Vec<&str> = documented
            .iter()
            .filter(|k| k.meaning.is_empty())
            .map(|k| k.key.as_str())
            .collect();
        assert!(
            undocumented.is_empty(),
            "give these fields a doc comment in sections/: {undocumented:?}"
        );
        let seed = documented.iter().find(|k| k.key == "run.seed").unwrap();
        assert_eq!(seed.default, "40");
        let device = documented.iter().find(|k| k.key == "train.device").unwrap();
        assert!(device.meaning.contains("`cuda`"), "{device:?}");
        let combos = documented
            .iter()
            .find(|k| k.key == "data.channel_combinations")
            .unwrap();
        assert_eq!(combos.default, r#"["01234", "0", "1", "2", "3", "4"]"#);
    }

    /// `key: value` as a file writes it (`a.b.c` nested in its sections).
    fn nested_yaml(key: &str, value: &str) -> String {
        let parts: Vec<&str> = key.split('.').collect();
        let mut text = String::new();
        for (depth, part) in parts.iter().enumerate() {
            let indent = "  ".repeat(depth);
            if depth + 1 == parts.len() {
                let _ = writeln!(text, "{indent}{part}: {value}");
            } else {
                let _ = writeln!(text, "{indent}{part}:");
            }
        }
        text
    }

    /// The page lists exactly the values validation accepts: each listed value of an enum key
    /// loads (in a file of its own, or beside a setting it documents needing, it is not
    /// refused under its own key), and a spelling that is not listed is refused naming the
    /// key's line. (`train.optimizer` listed scDINO's `sgd` and `lars`, which validation
    /// refused.)
    #[test]
    fn enum_keys_list_exactly_the_values_validation_accepts() {
        use crate::{Config, ConfigError};
        // Settings some values need (`bag_pool: mean` pools a bag model's features,
        // `tokens_pool: cls_and_channels` a tokens model's).
        let contexts = [
            "",
            "model:\n  channels: bag\n",
            "model:\n  channels: tokens\n",
        ];
        let enum_keys: Vec<KeyDoc> = keys()
            .into_iter()
            .filter(|k| !k.values.is_empty())
            .collect();
        assert!(enum_keys.len() >= 10, "{enum_keys:?}");
        for k in &enum_keys {
            let section = k.key.split('.').next().unwrap();
            let applicable: Vec<&str> = contexts
                .into_iter()
                .filter(|c| !c.starts_with(&format!("{section}:")))
                .collect();
            for value in &k.values {
                let refusals: Vec<String> = applicable
                    .iter()
                    .filter_map(|c| {
                        let text = format!("{c}{}", nested_yaml(&k.key, value));
                        match Config::from_yaml(&text, "t.yaml") {
                            Ok(_) => None,
                            Err(ConfigError::Invalid { key, .. }) if key != k.key => None,
                            Err(e) => Some(e.to_string()),
                        }
                    })
                    .collect();
                assert!(
                    refusals.len() < applicable.len(),
                    "{} lists `{value}`, which is refused: {refusals:?}",
                    k.key
                );
            }
            let text = nested_yaml(&k.key, "no_such_value");
            let e = Config::from_yaml(&text, "t.yaml").unwrap_err().to_string();
            let line = k.key.matches('.').count() + 1;
            assert!(
                e.contains("no_such_value") && e.contains(&format!("line {line}")),
                "{}: {e}",
                k.key
            );
        }
        let optimizer = enum_keys
            .iter()
            .find(|k| k.key == "train.optimizer")
            .unwrap();
        assert_eq!(optimizer.values, ["adamw"]);
    }

    /// A key nothing reads says so on the page, with what decides instead.
    #[test]
    fn ignored_keys_say_so_on_the_page() {
        let documented = keys();
        for ignored in IGNORED_KEYS {
            let k = documented.iter().find(|k| k.key == ignored.key).unwrap();
            assert!(
                k.meaning
                    .contains("Accepted for scDINO compatibility and ignored")
                    && k.meaning.contains(ignored.instead),
                "{k:?}"
            );
        }
        let read = documented
            .iter()
            .find(|k| k.key == "train.num_gpus")
            .unwrap();
        assert!(!read.meaning.contains("ignored"), "{read:?}");
        assert!(read.meaning.contains("--nproc"), "{read:?}");
    }

    /// `docs/config-reference.md` is this rendering. After a deliberate change:
    /// `SCDINO_BLESS=1 cargo test -p scdino-config config_reference`, and review the diff.
    #[test]
    fn config_reference_page_is_generated() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/config-reference.md");
        let page = markdown();
        if std::env::var_os("SCDINO_BLESS").is_some() {
            std::fs::write(&path, &page).unwrap();
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == page,
            "{} differs from the generated reference: {REGENERATE}",
            path.display()
        );
    }
}
