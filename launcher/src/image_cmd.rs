//! `launcher image …` and `launcher run`: argument parsing and output; the work is in
//! `launcher::image`. Machine-readable results (image ID, pushed reference, squashfs path) go
//! to stdout, progress to stderr.
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use launcher::image::{builder, engine, inspect, local_run, push, reference::ImageRef, squash};
use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::PathBuf;

#[derive(Debug, Subcommand)]
pub enum ImageCommand {
    /// Build the image from the Containerfile through the Docker Engine API.
    Build(BuildArgs),
    /// Push an image the engine holds; prints REPO@sha256:DIGEST.
    Push {
        /// REGISTRY/REPO:TAG, as built.
        image: String,
        /// Talk to the registry over plain HTTP, without TLS (only for a registry you trust).
        /// Implied for a registry on this machine (localhost, 127.0.0.0/8, [::1]), as Docker
        /// treats them.
        #[arg(long)]
        plain_http: bool,
    },
    /// Print an image's provenance labels and config (from the engine, else the registry).
    Inspect {
        image: String,
        /// Read the manifest and config from the registry even if the engine has the image.
        #[arg(long)]
        registry: bool,
        /// Talk to the registry over plain HTTP, without TLS (only for a registry you trust).
        /// Implied for a registry on this machine (localhost, 127.0.0.0/8, [::1]), as Docker
        /// treats them.
        #[arg(long)]
        plain_http: bool,
        #[arg(long)]
        json: bool,
    },
    /// Write the image as an Enroot squashfs named by its ID into --out; prints its path.
    Squash {
        image: String,
        #[arg(long)]
        out: PathBuf,
        /// mksquashfs options (Enroot's default ENROOT_SQUASH_OPTIONS).
        #[arg(long, default_value = squash::DEFAULT_OPTIONS, allow_hyphen_values = true)]
        squash_options: String,
    },
}

#[derive(Debug, Args)]
pub struct BuildArgs {
    /// The Containerfile.
    #[arg(long, short = 'f', default_value = "Containerfile")]
    file: PathBuf,
    /// The build context (the repository root).
    #[arg(long, default_value = ".")]
    context: PathBuf,
    /// Image name, repeatable: REGISTRY/REPO:TAG.
    #[arg(long, short = 't', required = true)]
    tag: Vec<String>,
    /// KEY=VALUE, repeatable (CUDA_IMAGE, EFA_INSTALLER_VERSION, BINARIES, ...).
    #[arg(long = "build-arg", value_name = "KEY=VALUE")]
    build_arg: Vec<String>,
    #[arg(long)]
    target: Option<String>,
    /// Bake this trainer run config into the image (validated first).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Push every tag after the build.
    #[arg(long)]
    push: bool,
    /// Talk to the registry over plain HTTP, without TLS (only for a registry you trust).
    /// Implied for a registry on this machine (localhost, 127.0.0.0/8, [::1]), as Docker
    /// treats them.
    #[arg(long)]
    plain_http: bool,
    /// Folder of the built trainer and launcher for BINARIES=prebuilt (default: this
    /// launcher's folder).
    #[arg(long)]
    prebuilt_dir: Option<PathBuf>,
    /// The venv the prebuilt libraries come from (for the version labels).
    #[arg(long, default_value = ".venv")]
    venv: PathBuf,
    /// Network of the RUN steps (`host` where the engine runs without a bridge).
    #[arg(long)]
    network: Option<String>,
    #[arg(long)]
    no_cache: bool,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The image (its entrypoint is the trainer).
    image: String,
    /// GPUs as `docker run --gpus`: all, a count, or device=ID[,ID].
    #[arg(long)]
    gpus: Option<local_run::Gpus>,
    /// HOST:CONTAINER[:ro], repeatable.
    #[arg(long)]
    mount: Vec<local_run::Mount>,
    /// K=V, or K to pass this shell's value; repeatable.
    #[arg(long)]
    env: Vec<String>,
    #[arg(long, default_value = "host")]
    network: String,
    /// Shared memory (/dev/shm), e.g. 1g, 512m.
    #[arg(long, default_value = "1g")]
    shm_size: String,
    /// uid:gid inside the container (default: yours, so outputs on mounts are yours).
    #[arg(long)]
    user: Option<String>,
    /// Create the container, print its ID and stop there (to inspect what would run).
    #[arg(long)]
    create_only: bool,
    /// The trainer's arguments, after `--`.
    #[arg(last = true)]
    args: Vec<String>,
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")
}

fn parse_size(s: &str) -> Result<i64> {
    let s = s.trim().to_ascii_lowercase();
    let (num, mult) = match s.chars().last() {
        Some('k') => (&s[..s.len() - 1], 1i64 << 10),
        Some('m') => (&s[..s.len() - 1], 1 << 20),
        Some('g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s.as_str(), 1),
    };
    let n: i64 = num
        .parse()
        .with_context(|| format!("size `{s}`: expected a number with k/m/g"))?;
    Ok(n * mult)
}

pub fn image(cmd: ImageCommand) -> Result<()> {
    let rt = runtime()?;
    match cmd {
        ImageCommand::Build(a) => rt.block_on(build(a)),
        ImageCommand::Push { image, plain_http } => rt.block_on(async {
            let r = ImageRef::parse(&image)?;
            let docker = engine::connect().await?;
            let digest = push::push(&docker, &r, plain_http).await?;
            println!("{}", r.with_digest(&digest));
            Ok(())
        }),
        ImageCommand::Inspect {
            image,
            registry,
            plain_http,
            json,
        } => rt.block_on(async {
            let facts = if registry {
                inspect::from_registry(&ImageRef::parse(&image)?, plain_http).await?
            } else {
                let local = match engine::connect().await {
                    Ok(d) => inspect::from_engine(&d, &image).await?,
                    Err(e) => {
                        tracing::info!("[launcher] {e}; reading the registry");
                        None
                    }
                };
                match local {
                    Some(f) => f,
                    None => inspect::from_registry(&ImageRef::parse(&image)?, plain_http).await?,
                }
            };
            if json {
                println!("{}", serde_json::to_string_pretty(&facts.to_json())?);
            } else {
                print!("{}", facts.to_text());
            }
            Ok(())
        }),
        ImageCommand::Squash {
            image,
            out,
            squash_options,
        } => rt.block_on(async {
            let docker = engine::connect().await?;
            let t = std::time::Instant::now();
            let s = squash::squash(&docker, &image, &out, &squash_options).await?;
            tracing::info!(
                "[squash] {} {} ({:.1} MiB, sha256 {}) in {:.1} s",
                if s.reused { "reused" } else { "wrote" },
                s.path.display(),
                s.bytes as f64 / (1 << 20) as f64,
                s.sha256,
                t.elapsed().as_secs_f64()
            );
            println!("{}", s.path.display());
            Ok(())
        }),
    }
}

async fn build(a: BuildArgs) -> Result<()> {
    let tags = a
        .tag
        .iter()
        .map(|t| ImageRef::parse(t))
        .collect::<Result<Vec<_>, _>>()?;
    let req = builder::BuildRequest {
        context: a.context.clone(),
        file: a.file.clone(),
        tags,
        build_args: parse_build_args(&a.build_arg)?,
        target: a.target,
        config: a.config.clone(),
        prebuilt_dir: prebuilt_dir(a.prebuilt_dir)?,
        venv: a.context.join(&a.venv),
        network: a.network,
        no_cache: a.no_cache,
    };
    let (id, pushed) = build_and_push(&req, a.push, a.plain_http).await?;
    println!("{id}");
    for p in pushed {
        println!("{p}");
    }
    Ok(())
}

/// The `--build-arg`s as a map. With `BINARIES=prebuilt` the build stage only copies the
/// host's binaries, so a `BUILD_IMAGE` not given is the `CUDA_IMAGE` given (the offline
/// build then needs no image beyond the one base it names).
pub fn parse_build_args(args: &[String]) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for kv in args {
        let Some((k, v)) = kv.split_once('=') else {
            bail!("--build-arg {kv}: expected KEY=VALUE");
        };
        out.insert(k.to_string(), v.to_string());
    }
    if out.get("BINARIES").map(String::as_str) == Some("prebuilt")
        && !out.contains_key("BUILD_IMAGE")
    {
        if let Some(base) = out.get("CUDA_IMAGE").cloned() {
            out.insert("BUILD_IMAGE".into(), base);
        }
    }
    Ok(out)
}

/// The folder of the prebuilt binaries: given, or this launcher's own folder.
pub fn prebuilt_dir(given: Option<PathBuf>) -> Result<PathBuf> {
    match given {
        Some(d) => Ok(d),
        None => Ok(std::env::current_exe()
            .context("locating this launcher")?
            .parent()
            .context("launcher has no folder")?
            .to_path_buf()),
    }
}

/// Builds (refusing bad input before the engine is contacted) and, with `push`, pushes every
/// tag; the image ID and the pushed `NAME@sha256:…` references.
pub async fn build_and_push(
    req: &builder::BuildRequest,
    push: bool,
    plain_http: bool,
) -> Result<(String, Vec<String>)> {
    let prepared = builder::prepare(req)?;
    if let Some(c) = &req.config {
        tracing::info!(
            "[launcher] {} is valid; baking it into {} (sha256 {})",
            c.display(),
            launcher::image::BAKED_CONFIG_PATH,
            prepared.labels[launcher::image::CONFIG_DIGEST_LABEL]
        );
    }
    let docker = engine::connect().await?;
    let mut log = builder::BuildLog::new(std::io::stderr().is_terminal());
    let t = std::time::Instant::now();
    let id = builder::build(&docker, req, prepared, &mut log).await?;
    tracing::info!(
        "[launcher] built {} as {} in {:.1} s",
        id,
        req.tags
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", "),
        t.elapsed().as_secs_f64()
    );
    let mut pushed = Vec::new();
    if push {
        for tag in &req.tags {
            let digest = push::push(&docker, tag, plain_http).await?;
            pushed.push(tag.with_digest(&digest));
        }
    }
    Ok((id, pushed))
}

/// `launcher submit --build`: build the image with the trainer config baked in, then push it
/// (the jobs pull `REGISTRY#REPO:TAG`) or squash it (the jobs mount the file); the image
/// reference the jobs use.
#[derive(Debug, Args)]
pub struct SubmitBuildArgs {
    /// Build the image first as this tag (REGISTRY/REPO:TAG), the trainer config baked in.
    #[arg(long, value_name = "TAG")]
    pub build: Option<String>,
    /// KEY=VALUE for the build, repeatable.
    #[arg(long = "build-arg", value_name = "KEY=VALUE", requires = "build")]
    pub build_arg: Vec<String>,
    /// Push the built image; the jobs pull it (Enroot `REGISTRY#REPO:TAG`).
    #[arg(long, requires = "build", conflicts_with = "squash_dir")]
    pub push: bool,
    /// Push over plain HTTP, without TLS (only to a registry you trust). Implied for a
    /// registry on this machine (localhost, 127.0.0.0/8, [::1]), as Docker treats them.
    #[arg(long, requires = "build")]
    pub plain_http: bool,
    /// Squash the built image into this folder (shared storage); the jobs mount the file.
    #[arg(long, value_name = "DIR", requires = "build")]
    pub squash_dir: Option<PathBuf>,
    /// Network of the RUN steps.
    #[arg(long = "build-network", requires = "build")]
    pub network: Option<String>,
}

impl SubmitBuildArgs {
    /// Builds and publishes; `None` without `--build`.
    pub fn image_for_jobs(
        &self,
        trainer_config: &std::path::Path,
        enroot_version: u32,
    ) -> Result<Option<String>> {
        let Some(tag) = &self.build else {
            return Ok(None);
        };
        if !self.push && self.squash_dir.is_none() {
            bail!("--build needs --push (jobs pull from the registry) or --squash-dir DIR (jobs mount the squashfs)");
        }
        let tag = ImageRef::parse(tag)?;
        if self.push && tag.registry.is_none() {
            bail!("--build {tag} --push: name the registry in the tag (REGISTRY/REPO:TAG)");
        }
        let req = builder::BuildRequest {
            context: PathBuf::from("."),
            file: PathBuf::from("Containerfile"),
            tags: vec![tag.clone()],
            build_args: parse_build_args(&self.build_arg)?,
            target: None,
            config: Some(trainer_config.to_path_buf()),
            prebuilt_dir: prebuilt_dir(None)?,
            venv: PathBuf::from(".venv"),
            network: self.network.clone(),
            no_cache: false,
        };
        let rt = runtime()?;
        rt.block_on(async {
            let (id, pushed) = build_and_push(&req, self.push, self.plain_http).await?;
            if self.push {
                // Enroot 4 pulls by digest: exactly the image just built, whatever the tag
                // points at later.
                if enroot_version >= 4 {
                    return Ok(pushed.into_iter().next());
                }
                // Enroot 3.x form: REGISTRY#REPO:TAG (no digests).
                return Ok(Some(format!(
                    "{}#{}:{}",
                    tag.registry_host(),
                    tag.repository,
                    tag.tag_or_latest()
                )));
            }
            let dir = std::path::absolute(self.squash_dir.as_ref().expect("checked"))?;
            let docker = engine::connect().await?;
            let s = squash::squash(&docker, &id, &dir, squash::DEFAULT_OPTIONS).await?;
            tracing::info!(
                "[squash] {} {}",
                if s.reused { "reused" } else { "wrote" },
                s.path.display()
            );
            Ok(Some(s.path.display().to_string()))
        })
    }
}

pub fn run_image(a: RunArgs) -> Result<()> {
    let req = local_run::RunRequest {
        image: a.image,
        gpus: a.gpus,
        mounts: a.mount,
        env: a.env,
        args: a.args,
        network: a.network,
        shm_size_bytes: parse_size(&a.shm_size)?,
        user: a.user,
    };
    let rt = runtime()?;
    let code = rt.block_on(async {
        let docker = engine::connect().await?;
        if a.create_only {
            let id = local_run::create(&docker, &req).await?;
            println!("{id}");
            return Ok::<i64, anyhow::Error>(0);
        }
        Ok(local_run::run(&docker, &req).await?)
    })?;
    drop(rt);
    if code != 0 {
        std::process::exit(code.clamp(1, 255) as i32);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prebuilt_build_takes_its_build_stage_from_the_runtime_base() {
        let args = |v: &[&str]| {
            parse_build_args(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
        };
        let a = args(&[
            "CUDA_IMAGE=scdino-base:bookworm",
            "BINARIES=prebuilt",
            "EFA_INSTALLER_VERSION=none",
        ]);
        assert_eq!(a["BUILD_IMAGE"], "scdino-base:bookworm");
        // Given, it stays; a source build keeps the Containerfile's devel image.
        let a = args(&["CUDA_IMAGE=x", "BINARIES=prebuilt", "BUILD_IMAGE=y"]);
        assert_eq!(a["BUILD_IMAGE"], "y");
        let a = args(&["CUDA_IMAGE=x", "BINARIES=source"]);
        assert!(!a.contains_key("BUILD_IMAGE"));
        let a = args(&["BINARIES=prebuilt"]);
        assert!(!a.contains_key("BUILD_IMAGE"));
        assert!(parse_build_args(&["NOEQUALS".to_string()]).is_err());
    }

    #[test]
    fn registries_on_this_machine_are_plain_http_as_in_docker() {
        use push::base_url;
        let url = |r: &str, plain| base_url(&ImageRef::parse(r).unwrap(), plain);
        assert_eq!(url("127.0.0.1:5555/a/b:t", false), "http://127.0.0.1:5555");
        assert_eq!(url("127.4.5.6/a:t", false), "http://127.4.5.6");
        assert_eq!(url("localhost:5000/a:t", false), "http://localhost:5000");
        assert_eq!(url("[::1]:5000/a:t", false), "http://[::1]:5000");
        assert_eq!(
            url("registry.example.com/a:t", false),
            "https://registry.example.com"
        );
        assert_eq!(
            url("registry.example.com/a:t", true),
            "http://registry.example.com"
        );
        assert_eq!(url("128.0.0.1:5000/a:t", false), "https://128.0.0.1:5000");
        assert_eq!(
            url("localhost.example.com/a:t", false),
            "https://localhost.example.com"
        );
    }
}
