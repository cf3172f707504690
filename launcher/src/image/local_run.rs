//! `launcher run`: the image on this machine, as a user smoke-tests it on one GPU before a
//! cluster run. `docker run --gpus` semantics for device requests, NVIDIA's recommended
//! shared-memory size and memlock/stack limits for PyTorch containers, the caller's uid:gid so
//! files written to mounts belong to the caller, logs streamed, Ctrl-C/SIGTERM turned into the
//! trainer's stop (it checkpoints and exits 75), the container removed, its exit code returned.
use super::engine::{engine_error, remove_container};
use super::{EngineError, ImageError};
use bollard::models::{ContainerCreateBody, DeviceRequest, HostConfig, ResourcesUlimits};
use bollard::query_parameters::{KillContainerOptionsBuilder, LogsOptionsBuilder};
use bollard::Docker;
use futures_util::StreamExt;
use std::io::Write;
use std::path::{Path, PathBuf};

/// `--gpus` as `docker run` takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gpus {
    All,
    Count(i64),
    Devices(Vec<String>),
}

impl std::str::FromStr for Gpus {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if s == "all" {
            return Ok(Gpus::All);
        }
        if let Some(ids) = s.strip_prefix("device=") {
            let ids: Vec<String> = ids.split(',').map(|d| d.trim().to_string()).collect();
            if ids.iter().any(String::is_empty) {
                return Err(format!("--gpus {s}: empty device id"));
            }
            return Ok(Gpus::Devices(ids));
        }
        match s.parse::<i64>() {
            Ok(n) if n > 0 => Ok(Gpus::Count(n)),
            _ => Err(format!(
                "--gpus {s}: expected `all`, a positive count or `device=ID[,ID...]`"
            )),
        }
    }
}

impl Gpus {
    /// The engine's DeviceRequest for `--gpus` (moby's opts/gpus.go).
    pub fn device_request(&self) -> DeviceRequest {
        let (count, ids) = match self {
            Gpus::All => (Some(-1), None),
            Gpus::Count(n) => (Some(*n), None),
            Gpus::Devices(ids) => (None, Some(ids.clone())),
        };
        DeviceRequest {
            driver: Some(String::new()),
            count,
            device_ids: ids,
            capabilities: Some(vec![vec!["gpu".into()]]),
            options: Some(Default::default()),
        }
    }
}

/// `HOST:CONTAINER[:ro]`; the host path must exist and is made absolute.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    pub host: PathBuf,
    pub container: String,
    pub read_only: bool,
}

impl std::str::FromStr for Mount {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let parts: Vec<&str> = s.split(':').collect();
        let (host, container, read_only) = match parts.as_slice() {
            [h, c] => (*h, *c, false),
            [h, c, "ro"] => (*h, *c, true),
            [h, c, "rw"] => (*h, *c, false),
            _ => return Err(format!("--mount {s}: expected HOST:CONTAINER[:ro]")),
        };
        if !container.starts_with('/') {
            return Err(format!("--mount {s}: the container path must be absolute"));
        }
        let host = std::path::absolute(Path::new(host)).map_err(|e| format!("--mount {s}: {e}"))?;
        if !host.exists() {
            return Err(format!(
                "--mount {s}: {} does not exist on this machine",
                host.display()
            ));
        }
        Ok(Mount {
            host,
            container: container.to_string(),
            read_only,
        })
    }
}

#[derive(Debug, Clone)]
pub struct RunRequest {
    pub image: String,
    pub gpus: Option<Gpus>,
    pub mounts: Vec<Mount>,
    /// `K=V`, or `K` to pass this process's value (skipped when unset), as `docker run -e`.
    pub env: Vec<String>,
    /// Arguments after the entrypoint (the trainer's subcommand and flags).
    pub args: Vec<String>,
    pub network: String,
    pub shm_size_bytes: i64,
    /// `uid:gid`; default the caller's.
    pub user: Option<String>,
}

/// NVIDIA's PyTorch container guidance: `--shm-size=1g --ulimit memlock=-1 --ulimit stack=64M`.
pub const DEFAULT_SHM_BYTES: i64 = 1 << 30;
const STACK_BYTES: i64 = 64 << 20;

pub fn caller_user() -> String {
    // SAFETY: getuid/getgid cannot fail and touch no memory.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    format!("{uid}:{gid}")
}

/// The memlock limit to ask for: unlimited (-1) as NVIDIA recommends, unless this machine's
/// hard limit is lower, in which case the runtime could not raise it either ("error setting
/// rlimit type 8: operation not permitted"): then the hard limit, and a warning.
pub fn memlock_limit() -> i64 {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct passed and nothing else.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) } == 0;
    if !ok || r.rlim_max == libc::RLIM_INFINITY {
        return -1;
    }
    tracing::info!(
        "[launcher] warning: locked memory is limited to {} KiB on this machine (ulimit -Hl), so the container gets that instead of unlimited; NCCL/EFA on GPUs want unlimited",
        r.rlim_max / 1024
    );
    r.rlim_max as i64
}

pub fn create_body(req: &RunRequest) -> ContainerCreateBody {
    let env: Vec<String> = req
        .env
        .iter()
        .filter_map(|e| match e.split_once('=') {
            Some(_) => Some(e.clone()),
            None => std::env::var(e).ok().map(|v| format!("{e}={v}")),
        })
        .collect();
    let binds = req
        .mounts
        .iter()
        .map(|m| {
            format!(
                "{}:{}{}",
                m.host.display(),
                m.container,
                if m.read_only { ":ro" } else { "" }
            )
        })
        .collect();
    let ulimit = |name: &str, v: i64| ResourcesUlimits {
        name: Some(name.into()),
        soft: Some(v),
        hard: Some(v),
    };
    ContainerCreateBody {
        image: Some(req.image.clone()),
        cmd: Some(req.args.clone()),
        env: Some(env),
        user: Some(req.user.clone().unwrap_or_else(caller_user)),
        host_config: Some(HostConfig {
            binds: Some(binds),
            device_requests: req.gpus.as_ref().map(|g| vec![g.device_request()]),
            shm_size: Some(req.shm_size_bytes),
            ulimits: Some(vec![
                ulimit("memlock", memlock_limit()),
                ulimit("stack", STACK_BYTES),
            ]),
            network_mode: Some(req.network.clone()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Creates the container without starting it; its ID.
pub async fn create(docker: &Docker, req: &RunRequest) -> Result<String, ImageError> {
    let created = docker
        .create_container(None, create_body(req))
        .await
        .map_err(|e| engine_error(&format!("creating a container of {}", req.image), e))?;
    Ok(created.id)
}

/// Runs to completion; the container's exit code.
pub async fn run(docker: &Docker, req: &RunRequest) -> Result<i64, ImageError> {
    let id = create(docker, req).await?;
    let result = run_created(docker, &id).await;
    remove_container(docker, &id).await;
    result
}

async fn run_created(docker: &Docker, id: &str) -> Result<i64, ImageError> {
    use tokio::signal::unix::{signal, SignalKind};
    docker
        .start_container(id, None)
        .await
        .map_err(|e| engine_error("starting the container", e))?;
    let logs = {
        let docker = docker.clone();
        let id = id.to_string();
        tokio::spawn(async move {
            let opts = LogsOptionsBuilder::default()
                .follow(true)
                .stdout(true)
                .stderr(true)
                .build();
            let mut s = docker.logs(&id, Some(opts));
            while let Some(Ok(out)) = s.next().await {
                use bollard::container::LogOutput::*;
                match out {
                    StdOut { message } | Console { message } => {
                        let mut o = std::io::stdout().lock();
                        let _ = o.write_all(&message);
                        let _ = o.flush();
                    }
                    StdErr { message } => {
                        let _ = std::io::stderr().lock().write_all(&message);
                    }
                    StdIn { .. } => {}
                }
            }
        })
    };
    let mut int = signal(SignalKind::interrupt()).map_err(EngineError::Signals)?;
    let mut term = signal(SignalKind::terminate()).map_err(EngineError::Signals)?;
    let mut wait = docker.wait_container(id, None);
    let mut stops = 0;
    let code = loop {
        tokio::select! {
            w = wait.next() => {
                break match w {
                    Some(Ok(r)) => r.status_code,
                    Some(Err(bollard::errors::Error::DockerContainerWaitError { code, .. })) => code,
                    Some(Err(e)) => return Err(engine_error("waiting for the container", e)),
                    None => return Err(EngineError::ContainerUnreported.into()),
                };
            }
            _ = int.recv() => stops += 1,
            _ = term.recv() => stops += 1,
        }
        // First signal: the trainer's stop (checkpoint at the next step, exit 75). Second: kill.
        let sig = if stops == 1 { "SIGTERM" } else { "SIGKILL" };
        tracing::info!("[launcher] forwarding {sig} to the container");
        let _ = docker
            .kill_container(
                id,
                Some(KillContainerOptionsBuilder::default().signal(sig).build()),
            )
            .await;
    };
    let _ = logs.await;
    Ok(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpus_parse_like_docker() {
        assert_eq!(
            "all".parse::<Gpus>().unwrap().device_request().count,
            Some(-1)
        );
        let r = "2".parse::<Gpus>().unwrap().device_request();
        assert_eq!(
            (r.count, r.capabilities),
            (Some(2), Some(vec![vec!["gpu".to_string()]]))
        );
        let r = "device=0,3".parse::<Gpus>().unwrap().device_request();
        assert_eq!(
            (r.count, r.device_ids),
            (None, Some(vec!["0".into(), "3".into()]))
        );
        assert!("0".parse::<Gpus>().is_err());
        assert!("device=".parse::<Gpus>().is_err());
    }

    #[test]
    fn mounts_and_env() {
        let d = tempfile::tempdir().unwrap();
        let m: Mount = format!("{}:/data:ro", d.path().display()).parse().unwrap();
        assert!(m.read_only && m.container == "/data");
        assert!(format!("{}:data", d.path().display())
            .parse::<Mount>()
            .is_err());
        assert!("/no/such/dir:/x"
            .parse::<Mount>()
            .unwrap_err()
            .contains("does not exist"));
        std::env::set_var("SCDINO_RUN_TEST_VAR", "v");
        let req = RunRequest {
            image: "i".into(),
            gpus: Some(Gpus::All),
            mounts: vec![m],
            env: vec![
                "A=1".into(),
                "SCDINO_RUN_TEST_VAR".into(),
                "SCDINO_UNSET_VAR_X".into(),
            ],
            args: vec!["pipeline".into()],
            network: "host".into(),
            shm_size_bytes: DEFAULT_SHM_BYTES,
            user: None,
        };
        let b = create_body(&req);
        assert_eq!(b.env.unwrap(), vec!["A=1", "SCDINO_RUN_TEST_VAR=v"]);
        let h = b.host_config.unwrap();
        assert_eq!(
            h.binds.unwrap(),
            vec![format!("{}:/data:ro", d.path().display())]
        );
        assert_eq!(h.shm_size, Some(1 << 30));
        assert_eq!(b.user.unwrap(), caller_user());
    }
}
