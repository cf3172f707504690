//! Environment variable names and Slurm time limits, as `cluster.yaml` writes them.

/// Variables the training batch script sets itself.
pub const RESERVED_ENV: [&str; 2] = ["MASTER_ADDR", "MASTER_PORT"];

pub fn is_env_name(s: &str) -> bool {
    !s.is_empty()
        && !s.as_bytes()[0].is_ascii_digit()
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// Names that hold credentials by convention (AWS_SECRET_ACCESS_KEY, HF_TOKEN, ...).
pub fn looks_like_secret(name: &str) -> bool {
    let n = name.to_ascii_uppercase();
    [
        "SECRET",
        "TOKEN",
        "PASSWORD",
        "PASSWD",
        "CREDENTIAL",
        "PRIVATE",
        "ACCESS_KEY",
        "API_KEY",
    ]
    .iter()
    .any(|w| n.contains(w))
}

/// Slurm time formats → seconds; `Ok(None)` for UNLIMITED/INFINITE.
pub fn parse_time(t: &str) -> Result<Option<u64>, String> {
    let bad = || {
        format!("{t:?} is not a Slurm time limit: write MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS")
    };
    if t.eq_ignore_ascii_case("unlimited") || t.eq_ignore_ascii_case("infinite") {
        return Ok(None);
    }
    let num = |s: &str| -> Result<u64, String> {
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) || s.len() > 6 {
            Err(bad())
        } else {
            s.parse().map_err(|_| bad())
        }
    };
    let secs = if let Some((d, rest)) = t.split_once('-') {
        let parts: Vec<&str> = rest.split(':').collect();
        let hms = match parts.as_slice() {
            [h] => num(h)? * 3600,
            [h, m] => num(h)? * 3600 + num(m)? * 60,
            [h, m, s] => num(h)? * 3600 + num(m)? * 60 + num(s)?,
            _ => return Err(bad()),
        };
        num(d)? * 86400 + hms
    } else {
        let parts: Vec<&str> = t.split(':').collect();
        match parts.as_slice() {
            [m] => num(m)? * 60,
            [m, s] => num(m)? * 60 + num(s)?,
            [h, m, s] => num(h)? * 3600 + num(m)? * 60 + num(s)?,
            _ => return Err(bad()),
        }
    };
    if secs == 0 {
        return Err(format!("{t:?} is a zero time limit"));
    }
    Ok(Some(secs))
}
