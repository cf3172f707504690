//! Registry credentials from the places Docker users already keep them, in Docker's order:
//! the environment (`LAUNCHER_REGISTRY_USERNAME` + `LAUNCHER_REGISTRY_PASSWORD`, for CI), then
//! `$DOCKER_CONFIG/config.json` (default `~/.docker/config.json`): a per-registry credential
//! helper (`credHelpers`, e.g. `ecr-login` → `docker-credential-ecr-login`), the default store
//! (`credsStore`), then inline `auths`. A secret is held in [`Secret`], whose Debug and Display
//! never show it, so it cannot reach a log line, a label or a generated script by accident.
use super::{CredentialsError, ImageError};
use base64::Engine as _;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// A password or token; formatting it prints `***`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: String) -> Self {
        Self(s)
    }
    /// The only way to the value: for the one request that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("***")
    }
}
impl std::fmt::Display for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("***")
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credentials {
    Basic {
        username: String,
        password: Secret,
    },
    /// An identity (refresh) token, as helpers return with the username `<token>`.
    IdentityToken(Secret),
}

/// Where the credentials came from (printed; never the credentials themselves).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub credentials: Credentials,
    pub source: String,
}

pub const ENV_USERNAME: &str = "LAUNCHER_REGISTRY_USERNAME";
pub const ENV_PASSWORD: &str = "LAUNCHER_REGISTRY_PASSWORD";

/// Credentials for `registry` (a host[:port] as in the image reference), or `None` for an
/// anonymous request.
pub fn lookup(registry: &str) -> Result<Option<Found>, ImageError> {
    if let (Ok(u), Ok(p)) = (std::env::var(ENV_USERNAME), std::env::var(ENV_PASSWORD)) {
        return Ok(Some(Found {
            credentials: Credentials::Basic {
                username: u,
                password: Secret::new(p),
            },
            source: format!("${ENV_USERNAME}/${ENV_PASSWORD}"),
        }));
    }
    let path = config_path();
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(CredentialsError::Unreadable { path, error: e }.into()),
    };
    from_config(&text, &path.display().to_string(), registry, &run_helper)
}

fn config_path() -> PathBuf {
    let dir = std::env::var_os("DOCKER_CONFIG")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".docker")))
        .unwrap_or_else(|| PathBuf::from(".docker"));
    dir.join("config.json")
}

/// Docker Hub's credentials live under its legacy index URL.
fn keys_for(registry: &str) -> Vec<String> {
    if registry == "docker.io" || registry == "index.docker.io" {
        vec![
            "https://index.docker.io/v1/".into(),
            "docker.io".into(),
            "index.docker.io".into(),
        ]
    } else {
        vec![
            registry.to_string(),
            format!("https://{registry}"),
            format!("http://{registry}"),
        ]
    }
}

type Helper<'a> = &'a dyn Fn(&str, &str) -> Result<Option<(String, Secret)>, ImageError>;

/// The lookup on a config.json's text; `helper(name, server)` runs a credential helper.
pub fn from_config(
    text: &str,
    origin: &str,
    registry: &str,
    helper: Helper,
) -> Result<Option<Found>, ImageError> {
    let json: serde_json::Value =
        serde_json::from_str(text).map_err(|error| CredentialsError::NotJson {
            origin: origin.to_string(),
            error,
        })?;
    let keys = keys_for(registry);
    let from_helper = |name: &str, server: &str| -> Result<Option<Found>, ImageError> {
        Ok(helper(name, server)?.map(|(user, secret)| Found {
            credentials: if user == "<token>" {
                Credentials::IdentityToken(secret)
            } else {
                Credentials::Basic {
                    username: user,
                    password: secret,
                }
            },
            source: format!("{origin}: docker-credential-{name}"),
        }))
    };
    if let Some(helpers) = json.get("credHelpers").and_then(|h| h.as_object()) {
        for k in &keys {
            if let Some(name) = helpers.get(k).and_then(|v| v.as_str()) {
                return from_helper(name, k);
            }
        }
    }
    if let Some(name) = json.get("credsStore").and_then(|v| v.as_str()) {
        if let Some(found) = from_helper(name, &keys[0])? {
            return Ok(Some(found));
        }
    }
    let Some(auths) = json.get("auths").and_then(|a| a.as_object()) else {
        return Ok(None);
    };
    for k in &keys {
        let Some(entry) = auths.get(k) else { continue };
        if let Some(tok) = entry.get("identitytoken").and_then(|v| v.as_str()) {
            return Ok(Some(Found {
                credentials: Credentials::IdentityToken(Secret::new(tok.to_string())),
                source: format!("{origin}: auths.{k}.identitytoken"),
            }));
        }
        if let Some(auth) = entry.get("auth").and_then(|v| v.as_str()) {
            let bad = || CredentialsError::AuthNotBase64 {
                origin: origin.to_string(),
                key: k.to_string(),
            };
            let raw = base64::engine::general_purpose::STANDARD
                .decode(auth.trim())
                .map_err(|_| bad())?;
            let raw = String::from_utf8(raw).map_err(|_| bad())?;
            let (u, p) = raw.split_once(':').ok_or_else(bad)?;
            return Ok(Some(Found {
                credentials: Credentials::Basic {
                    username: u.to_string(),
                    password: Secret::new(p.to_string()),
                },
                source: format!("{origin}: auths.{k}"),
            }));
        }
    }
    Ok(None)
}

/// Runs `docker-credential-NAME get` with the server on stdin (the helper protocol). "not
/// found" answers are `None`; anything else failing is an error naming the helper only.
fn run_helper(name: &str, server: &str) -> Result<Option<(String, Secret)>, ImageError> {
    let prog = format!("docker-credential-{name}");
    let mut child = Command::new(&prog)
        .arg("get")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|error| CredentialsError::HelperCannotRun {
            program: prog.clone(),
            error,
        })?;
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(server.as_bytes())
        .map_err(|error| CredentialsError::HelperIo {
            program: prog.clone(),
            error,
        })?;
    let out = child
        .wait_with_output()
        .map_err(|error| CredentialsError::HelperIo {
            program: prog.clone(),
            error,
        })?;
    if !out.status.success() {
        let msg = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        if msg.to_lowercase().contains("credentials not found") {
            return Ok(None);
        }
        // The helper's message describes its own failure; it never echoes a secret back.
        return Err(CredentialsError::HelperFailed {
            program: prog,
            server: server.to_string(),
            status: out.status,
            message: msg.trim().to_string(),
        }
        .into());
    }
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).map_err(|_| CredentialsError::HelperNotJson {
            program: prog.clone(),
        })?;
    match (v["Username"].as_str(), v["Secret"].as_str()) {
        (Some(u), Some(s)) => Ok(Some((u.to_string(), Secret::new(s.to_string())))),
        _ => Err(CredentialsError::HelperIncomplete { program: prog }.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_helper(_: &str, _: &str) -> Result<Option<(String, Secret)>, ImageError> {
        panic!("no helper expected")
    }

    #[test]
    fn inline_auth_and_docker_hub_key() {
        let auth = base64::engine::general_purpose::STANDARD.encode("ci:s3cret:with-colon");
        let text = format!(
            r#"{{"auths": {{"127.0.0.1:5000": {{"auth": "{auth}"}}, "https://index.docker.io/v1/": {{"identitytoken": "tok"}}}}}}"#
        );
        let f = from_config(&text, "c.json", "127.0.0.1:5000", &no_helper)
            .unwrap()
            .unwrap();
        assert_eq!(
            f.credentials,
            Credentials::Basic {
                username: "ci".into(),
                password: Secret::new("s3cret:with-colon".into())
            }
        );
        assert_eq!(f.source, "c.json: auths.127.0.0.1:5000");
        // Nothing secret in any rendering of what was found.
        let shown = format!("{f:?} {}", f.source);
        assert!(!shown.contains("s3cret"), "{shown}");
        let f = from_config(&text, "c.json", "docker.io", &no_helper)
            .unwrap()
            .unwrap();
        assert_eq!(
            f.credentials,
            Credentials::IdentityToken(Secret::new("tok".into()))
        );
        assert!(from_config(&text, "c.json", "other.io", &no_helper)
            .unwrap()
            .is_none());
    }

    #[test]
    fn helpers_win_over_auths_and_token_user_is_identity_token() {
        let text = r#"{"credHelpers": {"1234.dkr.ecr.us-east-1.amazonaws.com": "ecr-login"},
                      "auths": {"1234.dkr.ecr.us-east-1.amazonaws.com": {"auth": "eDp5"}}}"#;
        let helper = |name: &str, server: &str| {
            assert_eq!(
                (name, server),
                ("ecr-login", "1234.dkr.ecr.us-east-1.amazonaws.com")
            );
            Ok(Some(("AWS".to_string(), Secret::new("ecr-token".into()))))
        };
        let f = from_config(text, "c", "1234.dkr.ecr.us-east-1.amazonaws.com", &helper)
            .unwrap()
            .unwrap();
        assert_eq!(f.source, "c: docker-credential-ecr-login");
        assert!(
            matches!(f.credentials, Credentials::Basic { ref username, .. } if username == "AWS")
        );
        let token = |_: &str, _: &str| Ok(Some(("<token>".to_string(), Secret::new("t".into()))));
        let f = from_config(r#"{"credsStore": "desktop"}"#, "c", "r.io", &token)
            .unwrap()
            .unwrap();
        assert!(matches!(f.credentials, Credentials::IdentityToken(_)));
    }

    #[test]
    fn broken_auth_is_named_without_its_value() {
        let e = from_config(
            r#"{"auths": {"r.io": {"auth": "%%%"}}}"#,
            "c.json",
            "r.io",
            &no_helper,
        )
        .unwrap_err()
        .to_string();
        assert_eq!(e, "c.json: auths.r.io.auth is not base64 of USER:PASSWORD");
    }

    /// No formatting of anything that holds a credential shows it: Debug (plain and pretty)
    /// and Display of the secret, of both kinds of credentials and of what a lookup found,
    /// and the errors of a config whose broken JSON or auth field contains it.
    #[test]
    fn no_rendering_shows_a_secret() {
        const PW: &str = "pa55-Wd_7f3c";
        const TOKEN: &str = "tok-9a8b7c";
        let secret = Secret::new(PW.into());
        let basic = Credentials::Basic {
            username: "ci".into(),
            password: Secret::new(PW.into()),
        };
        let token = Credentials::IdentityToken(Secret::new(TOKEN.into()));
        let found = Found {
            credentials: basic.clone(),
            source: "c.json: auths.r.io".into(),
        };
        let shown = [
            format!("{secret}"),
            format!("{secret:?}"),
            format!("{secret:#?}"),
            format!("{basic:?}"),
            format!("{basic:#?}"),
            format!("{token:?}"),
            format!("{token:#?}"),
            format!("{found:?}"),
            format!("{found:#?}"),
            format!("{:?}", Some(found.clone())),
        ];
        for text in &shown {
            assert!(!text.contains(PW) && !text.contains(TOKEN), "{text}");
        }
        assert!(
            shown[3].contains("ci") && shown[3].contains("***"),
            "{}",
            shown[3]
        );
        assert_eq!(secret.expose(), PW);
        let auth = base64::engine::general_purpose::STANDARD.encode(format!("ci:{PW}"));
        let configs = [
            format!(r#"{{"auths": {{"r.io": {{"auth": "{auth}""#),
            format!(r#"{{"auths": {{"r.io": {{"auth": "{PW}%"}}}}}}"#),
            format!(r#"{{"auths": {{"r.io": {{"identitytoken": "{TOKEN}", }}}}}}"#),
        ];
        for text in &configs {
            let e = from_config(text, "c.json", "r.io", &no_helper).unwrap_err();
            for shown in [e.to_string(), format!("{e:?}")] {
                assert!(
                    !shown.contains(PW) && !shown.contains(TOKEN) && !shown.contains(&auth),
                    "{shown}"
                );
            }
        }
        let helper = |_: &str, _: &str| Ok(Some(("ci".to_string(), Secret::new(PW.into()))));
        let f = from_config(r#"{"credsStore": "x"}"#, "c", "r.io", &helper)
            .unwrap()
            .unwrap();
        assert!(!format!("{f:?} {f:#?}").contains(PW));
    }
}
