//! Reading typed values out of a scDINO yaml's mappings: every key read is removed, so what
//! is left over is what could not be mapped, and every ill-typed value is reported, never
//! dropped silently.
use crate::sections::ChannelCombination;
use serde_json::{Map, Value};

/// `{0: "aTub", 1: "BF"}` (original) or `"aTub,BF"` (AWS port) → names in channel order.
pub(super) fn channel_names(v: &Value) -> Result<Vec<String>, String> {
    match v {
        Value::String(csv) => Ok(csv.split(',').map(|s| s.trim().to_string()).collect()),
        Value::Object(m) => {
            let mut pairs: Vec<(usize, String)> = m
                .iter()
                .map(|(k, name)| {
                    let idx = k
                        .trim()
                        .parse::<usize>()
                        .map_err(|_| format!("key {k:?} is not a channel number"))?;
                    let name = name
                        .as_str()
                        .map(str::to_string)
                        .ok_or_else(|| format!("the name of channel {idx} is not a string"))?;
                    Ok((idx, name))
                })
                .collect::<Result<_, String>>()?;
            pairs.sort();
            for (expect, (idx, _)) in pairs.iter().enumerate() {
                if *idx != expect {
                    return Err(format!(
                        "channel numbers must run 0, 1, 2, ... without gaps (missing {expect})"
                    ));
                }
            }
            Ok(pairs.into_iter().map(|(_, n)| n).collect())
        }
        _ => Err("expected a mapping {0: name, ...} or a comma-separated string".into()),
    }
}

/// `["01234", "0"]` (original) or `"0,1,2,3,4"` / a bare number (AWS port: one combination).
pub(super) fn channel_combinations(
    v: &Value,
) -> Result<(Vec<ChannelCombination>, Option<String>), String> {
    match v {
        Value::Array(items) => items
            .iter()
            .map(|it| match it {
                Value::String(s) => Ok(ChannelCombination::Digits(s.clone())),
                Value::Number(n) => Ok(ChannelCombination::Digits(n.to_string())),
                _ => Err("each combination must be a string of channel digits".to_string()),
            })
            .collect::<Result<_, _>>()
            .map(|c| (c, None)),
        Value::String(s) if s.contains(',') => {
            let idx = s
                .split(',')
                .map(|p| p.trim().parse::<usize>())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|_| format!("{s:?} is not a comma-separated list of channel numbers"))?;
            Ok((
                vec![ChannelCombination::Indices(idx)],
                Some(format!(
                    "meta.selected_channel_combination_per_run {s:?} (AWS form) is one combination of those channels"
                )),
            ))
        }
        Value::String(s) => Ok((vec![ChannelCombination::Digits(s.clone())], None)),
        Value::Number(n) => Ok((vec![ChannelCombination::Digits(n.to_string())], None)),
        _ => Err("expected a list of digit strings such as [\"01234\", \"0\"]".into()),
    }
}

#[derive(Default)]
pub(super) struct Importer {
    pub(super) notes: Vec<String>,
    pub(super) unmapped: Vec<String>,
}

pub(super) fn take(map: &mut Map<String, Value>, path: &str) -> Option<Value> {
    let key = path.rsplit('.').next().unwrap_or(path);
    map.remove(key)
}

pub(super) fn compact(v: &Value) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

impl Importer {
    pub(super) fn section(
        &mut self,
        root: &mut Map<String, Value>,
        name: &str,
    ) -> Map<String, Value> {
        match root.remove(name) {
            Some(Value::Object(m)) => m,
            Some(other) => {
                self.bad(name, &other, "expected a mapping");
                Map::new()
            }
            None => {
                self.notes
                    .push(format!("section `{name}` is missing; defaults used"));
                Map::new()
            }
        }
    }

    /// The mapping under `path` in `m`: empty when absent, reported when not a mapping.
    pub(super) fn mapping(&mut self, m: &mut Map<String, Value>, path: &str) -> Map<String, Value> {
        match take(m, path) {
            Some(Value::Object(m)) => m,
            Some(other) => {
                self.bad(path, &other, "expected a mapping");
                Map::new()
            }
            None => Map::new(),
        }
    }

    pub(super) fn bad(&mut self, path: &str, v: &Value, why: &str) {
        self.unmapped
            .push(format!("{path} = {} ({why})", compact(v)));
    }

    pub(super) fn absent(&mut self, path: &str, used: &str) {
        self.notes.push(format!(
            "{path} is not set; scDINO ran with its argparse default {used}, imported as such"
        ));
    }

    pub(super) fn leftovers(&mut self, section: &str, map: Map<String, Value>) {
        for (k, v) in map {
            self.unmapped
                .push(format!("{section}.{k} = {}", compact(&v)));
        }
    }

    pub(super) fn leftovers_with_hint(
        &mut self,
        section: &str,
        map: Map<String, Value>,
        hint: &str,
    ) {
        for (k, v) in map {
            let why = if k == "nnodes" {
                format!(" ({hint})")
            } else {
                String::new()
            };
            self.unmapped
                .push(format!("{section}.{k} = {}{why}", compact(&v)));
        }
    }

    /// Each typed setter returns whether the key was present and mapped.
    pub(super) fn string(
        &mut self,
        m: &mut Map<String, Value>,
        path: &str,
        out: &mut String,
    ) -> bool {
        match take(m, path) {
            Some(Value::String(s)) => {
                *out = s;
                true
            }
            Some(Value::Number(n)) => {
                *out = n.to_string();
                true
            }
            Some(v) => {
                self.bad(path, &v, "expected text");
                false
            }
            None => false,
        }
    }

    pub(super) fn path(
        &mut self,
        m: &mut Map<String, Value>,
        path: &str,
        out: &mut std::path::PathBuf,
    ) -> bool {
        let mut s = String::new();
        let ok = self.string(m, path, &mut s);
        if ok {
            *out = s.into();
        }
        ok
    }

    pub(super) fn u64(&mut self, m: &mut Map<String, Value>, path: &str, out: &mut u64) -> bool {
        match take(m, path) {
            Some(v) => match v.as_u64() {
                Some(x) => {
                    *out = x;
                    true
                }
                None => {
                    self.bad(path, &v, "expected a whole number");
                    false
                }
            },
            None => false,
        }
    }

    pub(super) fn uint(&mut self, m: &mut Map<String, Value>, path: &str, out: &mut usize) -> bool {
        let mut x = 0u64;
        let ok = self.u64(m, path, &mut x);
        if ok {
            *out = x as usize;
        }
        ok
    }

    pub(super) fn float(&mut self, m: &mut Map<String, Value>, path: &str, out: &mut f64) -> bool {
        match take(m, path) {
            Some(v) => match v.as_f64() {
                Some(x) => {
                    *out = x;
                    true
                }
                None => {
                    self.bad(path, &v, "expected a number");
                    false
                }
            },
            None => false,
        }
    }

    pub(super) fn boolean(
        &mut self,
        m: &mut Map<String, Value>,
        path: &str,
        out: &mut bool,
    ) -> bool {
        match take(m, path) {
            Some(Value::Bool(b)) => {
                *out = b;
                true
            }
            Some(v) => {
                self.bad(path, &v, "expected True or False");
                false
            }
            None => false,
        }
    }

    pub(super) fn pair(
        &mut self,
        m: &mut Map<String, Value>,
        path: &str,
        out: &mut (f64, f64),
    ) -> bool {
        match take(m, path) {
            Some(v) => match v
                .as_array()
                .map(|a| a.iter().map(Value::as_f64).collect::<Vec<_>>())
            {
                Some(a) if a.len() == 2 && a.iter().all(Option::is_some) => {
                    *out = (a[0].unwrap_or_default(), a[1].unwrap_or_default());
                    true
                }
                _ => {
                    self.bad(
                        path,
                        &v,
                        "expected two numbers, e.g. !!python/tuple [0.4, 1.0]",
                    );
                    false
                }
            },
            None => false,
        }
    }
}
