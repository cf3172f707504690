//! What a Pyxis job sees: every host path a stage uses (the trainer config, the working
//! directory, and the dataset, output and cache folders the config names) mapped through
//! `container.mounts`. A path that no mount covers is refused at render time with its key and
//! line, instead of failing on the node as `pyxis: couldn't chdir` or a missing file.
//!
//! The trainer reads its config inside the container, so when a mount moves a path (`/fsx/data`
//! seen as `/data`) the jobs get a copy of the config with the container's paths, written next
//! to the scripts; with identity mounts (`/fsx:/fsx`) they read the user's file as it is.
use crate::cluster::{container_path, Cluster};
use scdino_config::{Config, DatasetLocation, KeyLines, Validator};
use std::path::{Component, Path, PathBuf};

/// The container's copy of the trainer config, written into the render folder when needed.
pub const CONTAINER_CONFIG: &str = "trainer-config.container.yaml";

#[derive(Debug, thiserror::Error)]
pub enum ViewError {
    #[error(transparent)]
    Cluster(#[from] crate::cluster::ClusterError),
    /// A path inside the trainer config that no mount covers.
    #[error(transparent)]
    TrainerPath(scdino_config::Invalid),
    #[error(transparent)]
    Config(#[from] scdino_config::ConfigError),
    #[error("{0}")]
    Other(String),
}

/// Where the user's paths are, as the submitting host sees them.
#[derive(Debug, Clone)]
pub struct HostPaths<'a> {
    /// The trainer config file (absolute).
    pub trainer_config: &'a Path,
    /// The text of that file (its keys' lines are reported).
    pub trainer_text: &'a str,
    /// The trainer config came from `--config` (else from the cluster file's `trainer_config`).
    pub config_from_cli: bool,
    /// The folder `launcher render` runs in (absolute): the default working directory.
    pub cwd: &'a Path,
    /// The render folder (absolute), where the container's config copy goes.
    pub out: &'a Path,
}

/// The container's side of a job.
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerView {
    /// What `--config` says inside the container.
    pub config: PathBuf,
    /// The config with container paths, to be written as `<out>/CONTAINER_CONFIG`; None when
    /// the user's file reads the same inside the container.
    pub config_copy: Option<String>,
}

/// Lexically normalised (`a/./b/../c` → `a/c`), as the kernel resolves a path without links.
fn normalise(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// Whether `path` lies inside the container side of a mount.
fn under_a_destination(mounts: &[String], path: &Path) -> bool {
    mounts.iter().any(|m| {
        let mut parts = m.split(':');
        let src = parts.next().unwrap_or_default();
        let dst = parts.next().unwrap_or(src);
        normalise(path).starts_with(dst)
    })
}

fn mounts_list(cluster: &Cluster) -> String {
    if cluster.container.mounts.is_empty() {
        "container.mounts is empty".into()
    } else {
        format!("container.mounts: {}", cluster.container.mounts.join(", "))
    }
}

/// The working directory of every job inside the container (`workdir`, else the folder the
/// launcher runs in, mapped through the mounts).
pub fn workdir(cluster: &Cluster, cwd: &Path) -> Result<PathBuf, ViewError> {
    let host = cluster.workdir.clone().unwrap_or_else(|| cwd.to_path_buf());
    container_path(&cluster.container.mounts, &host).ok_or_else(|| {
        let m = format!(
            "{} is not under any container mount ({}): Pyxis could not chdir there; mount it or set `workdir:` to a mounted folder",
            host.display(),
            mounts_list(cluster)
        );
        match cluster.workdir {
            Some(_) => ViewError::Cluster(cluster.invalid("workdir", &m)),
            None => ViewError::Other(format!(
                "the working directory (the folder launcher runs in, as `workdir` is not set) {m}"
            )),
        }
    })
}

/// The trainer config as the container must read it.
#[derive(Debug, Clone)]
pub struct MappedConfig {
    /// The container path of the user's file.
    pub config_path: PathBuf,
    /// The validated config with container paths.
    pub config: Config,
    /// A mount moved one of its paths (the user's file reads differently inside).
    pub moved: bool,
}

/// Maps the trainer config and every path in it; see the module comment.
pub fn map(cluster: &Cluster, host: &HostPaths) -> Result<ContainerView, ViewError> {
    let m = map_config(cluster, host)?;
    if !m.moved {
        return Ok(ContainerView {
            config: m.config_path,
            config_copy: None,
        });
    }
    let copy_on_host = host.out.join(CONTAINER_CONFIG);
    let copy = container_path(&cluster.container.mounts, &copy_on_host).ok_or_else(|| {
        ViewError::Other(format!(
            "the container mounts move paths of {} (e.g. {} inside), so the jobs read a copy with the container's paths from the render folder {}, which is not under any container mount ({})",
            host.trainer_config.display(),
            m.config.run.output_dir.display(),
            host.out.display(),
            mounts_list(cluster)
        ))
    })?;
    let text = format!(
        "# Written by launcher render from {}: the same config with the paths the container\n# sees through container.mounts. Edit that file and render again, not this one.\n{}",
        host.trainer_config.display(),
        m.config.to_yaml()
    );
    Ok(ContainerView {
        config: copy,
        config_copy: Some(text),
    })
}

/// The container path of a host folder the launcher itself chose (e.g. a render folder),
/// refused with `what` when no mount covers it.
pub fn container_dir(cluster: &Cluster, host: &Path, what: &str) -> Result<PathBuf, ViewError> {
    container_path(&cluster.container.mounts, host).ok_or_else(|| {
        ViewError::Other(format!(
            "{what} {} is not under any container mount ({})",
            host.display(),
            mounts_list(cluster)
        ))
    })
}

/// The container path of a file or folder the user named on the command line (`what`, e.g.
/// `--checkpoint`; `host` absolute): mapped through the mounts, or kept as it is when it is
/// already a path inside a mount's destination; refused when neither.
pub fn named_path(cluster: &Cluster, host: &Path, what: &str) -> Result<PathBuf, ViewError> {
    let host = normalise(host);
    let mounts = &cluster.container.mounts;
    if let Some(inside) = container_path(mounts, &host) {
        return Ok(inside);
    }
    if under_a_destination(mounts, &host) {
        return Ok(host);
    }
    Err(ViewError::Other(format!(
        "{what} {} is not under any container mount ({}): the jobs could not reach it",
        host.display(),
        mounts_list(cluster)
    )))
}

/// [`map`] without writing anything: the config with container paths.
pub fn map_config(cluster: &Cluster, host: &HostPaths) -> Result<MappedConfig, ViewError> {
    let origin = host.trainer_config.display().to_string();
    let config = Config::from_yaml(host.trainer_text, &origin)?;
    // The paths are rewritten in the sections, which are then validated as a new config.
    let mut sections = config.sections();
    let host_workdir = cluster
        .workdir
        .clone()
        .unwrap_or_else(|| host.cwd.to_path_buf());
    let workdir = workdir(cluster, host.cwd)?;
    let mounts = &cluster.container.mounts;

    let config_path = container_path(mounts, host.trainer_config).ok_or_else(|| {
        let m = format!(
            "{} is not under any container mount ({}): the jobs could not read it",
            host.trainer_config.display(),
            mounts_list(cluster)
        );
        if host.config_from_cli {
            ViewError::Other(format!("--config {m}"))
        } else {
            ViewError::Cluster(cluster.invalid("trainer_config", &m))
        }
    })?;

    let lines = KeyLines::scan(host.trainer_text);
    let mut moved = false;
    let mut each = |key: &str, value: &mut PathBuf| -> Result<(), ViewError> {
        let on_host = normalise(&host_workdir.join(&*value));
        let Some(inside) = container_path(mounts, &on_host) else {
            // Already written as the container sees it (a config made for the image, e.g.
            // `/data` with a mount `/fsx/cells:/data`).
            if value.is_absolute() && under_a_destination(mounts, value) {
                return Ok(());
            }
            return Err(ViewError::TrainerPath(Validator::new(&origin, &lines).err(
                key,
                &format!(
                    "{} ({}) is not under any container mount ({}): the jobs could not reach it",
                    value.display(),
                    on_host.display(),
                    mounts_list(cluster)
                ),
            )));
        };
        // A relative path resolves against the container's working directory.
        let as_written = normalise(&workdir.join(&*value));
        if as_written != inside {
            *value = inside;
            moved = true;
        }
        Ok(())
    };
    each("run.output_dir", &mut sections.run.output_dir)?;
    // A dataset in a store (s3://, gs://, az://) needs no mount: the jobs reach it through
    // the network.
    if let DatasetLocation::Local(dir) = &mut sections.data.dataset_dir {
        each("data.dataset_dir", dir)?;
    }
    if let Some(DatasetLocation::Local(dir)) = sections.data.test_dir.as_mut() {
        each("data.test_dir", dir)?;
    }
    if let Some(dir) = sections.data.cache.dir.as_mut() {
        each("data.cache.dir", dir)?;
    }
    let config = Config::from_sections(sections, &origin)?;
    Ok(MappedConfig {
        config_path,
        config,
        moved,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(yaml: &str) -> Cluster {
        Cluster::from_yaml(
            &format!("container:\n  image: /fsx/img.sqsh\n{yaml}"),
            "cluster.yaml",
        )
        .unwrap()
    }

    const CFG: &str = "run:\n  output_dir: /fsx/out\ndata:\n  dataset_dir: /fsx/data\n  channel_names: [a, b]\n  channel_combinations: [\"01\"]\n";

    fn paths<'a>(text: &'a str, cwd: &'a Path) -> HostPaths<'a> {
        HostPaths {
            trainer_config: Path::new("/fsx/cfg/run.yaml"),
            trainer_text: text,
            config_from_cli: false,
            cwd,
            out: Path::new("/fsx/jobs"),
        }
    }

    #[test]
    fn identity_mounts_keep_the_users_file() {
        let c = cluster("  mounts: [\"/fsx:/fsx\"]\n");
        let v = map(&c, &paths(CFG, Path::new("/fsx/work"))).unwrap();
        assert_eq!(
            workdir(&c, Path::new("/fsx/work")).unwrap(),
            Path::new("/fsx/work")
        );
        assert_eq!(v.config, Path::new("/fsx/cfg/run.yaml"));
        assert_eq!(v.config_copy, None);
    }

    #[test]
    fn moved_paths_get_a_container_copy_that_the_trainer_accepts() {
        let c = cluster("  mounts: [\"/fsx/data:/data\", \"/fsx:/w\"]\nworkdir: /fsx/work\n");
        let text = format!("{CFG}  cache:\n    dir: ../cache\n");
        let v = map(&c, &paths(&text, Path::new("/elsewhere"))).unwrap();
        assert_eq!(
            workdir(&c, Path::new("/elsewhere")).unwrap(),
            Path::new("/w/work")
        );
        assert_eq!(v.config, Path::new("/w/jobs").join(CONTAINER_CONFIG));
        let copy = v.config_copy.unwrap();
        let back = Config::from_yaml(&copy, "copy").unwrap();
        assert_eq!(back.run.output_dir, Path::new("/w/out"));
        assert_eq!(
            back.data.dataset_dir,
            DatasetLocation::Local("/data".into())
        );
        // Relative and still right inside: kept as it is mapped the same way.
        assert_eq!(back.data.cache.dir.as_deref(), Some(Path::new("../cache")));
        let orig = Config::from_yaml(&text, "orig").unwrap();
        assert_eq!(back.channel_sets, orig.channel_sets);
        assert_eq!(back.model, orig.model);
    }

    #[test]
    fn an_explicit_workdir_is_mapped_like_the_default_one() {
        // The defect of issue 14: `workdir: /data` with `/data:/w` was emitted unmapped.
        let c = cluster("  mounts: [\"/data:/w\", \"/fsx:/fsx\"]\nworkdir: /data\n");
        assert_eq!(workdir(&c, Path::new("/fsx")).unwrap(), Path::new("/w"));
    }

    #[test]
    fn paths_outside_every_mount_are_refused_with_key_and_line() {
        let c = cluster("  mounts: [\"/fsx:/fsx\"]\nworkdir: /home/me\n");
        let e = workdir(&c, Path::new("/fsx")).unwrap_err().to_string();
        assert!(
            e.starts_with("cluster.yaml:4: `workdir`: /home/me is not under any container mount (container.mounts: /fsx:/fsx)"),
            "{e}"
        );
        let c = cluster("  mounts: [\"/fsx:/fsx\"]\n");
        let e = map(&c, &paths(CFG, Path::new("/home/me")))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("the working directory") && e.contains("/home/me"),
            "{e}"
        );
        let text = CFG.replace("/fsx/data", "/scratch/data");
        let e = map(&c, &paths(&text, Path::new("/fsx")))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("/fsx/cfg/run.yaml:4: `data.dataset_dir`: /scratch/data"),
            "{e}"
        );
        let text = format!("{CFG}  cache:\n    dir: /local_scratch\n");
        let e = map(&c, &paths(&text, Path::new("/fsx")))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("/fsx/cfg/run.yaml:8: `data.cache.dir`: /local_scratch"),
            "{e}"
        );
        let mut p = paths(CFG, Path::new("/fsx"));
        p.trainer_config = Path::new("/home/me/run.yaml");
        let e = map(&c, &p).unwrap_err().to_string();
        assert!(
            e.contains("`trainer_config`") || e.contains("/home/me/run.yaml"),
            "{e}"
        );
        p.config_from_cli = true;
        let e = map(&c, &p).unwrap_err().to_string();
        assert!(
            e.starts_with("--config /home/me/run.yaml is not under"),
            "{e}"
        );
    }

    #[test]
    fn paths_written_as_the_container_sees_them_are_kept() {
        let c = cluster("  mounts: [\"/fsx:/fsx\", \"/fsx/cells:/data\", \"/fsx/runs:/out\"]\n");
        let text = CFG
            .replace("/fsx/data", "/data/Training")
            .replace("/fsx/out", "/out");
        let v = map(&c, &paths(&text, Path::new("/fsx"))).unwrap();
        assert_eq!(v.config_copy, None);
        // Neither a host path under a mount nor a container path: refused.
        let text = CFG.replace("/fsx/data", "/datasets/x");
        assert!(map(&c, &paths(&text, Path::new("/fsx")))
            .unwrap_err()
            .to_string()
            .contains("`data.dataset_dir`"));
    }

    #[test]
    fn store_datasets_need_no_mount() {
        let c = cluster("  mounts: [\"/fsx:/fsx\"]\n");
        for url in [
            "s3://bucket/cells",
            "gs://bucket/cells",
            "az://container/cells",
        ] {
            let text = CFG.replace("/fsx/data", url);
            let v = map(&c, &paths(&text, Path::new("/fsx"))).unwrap();
            assert_eq!(v.config_copy, None, "{url}");
        }
        // A file:// URL is a path like any other, so it needs its mount.
        let text = CFG.replace("/fsx/data", "file:///scratch/data");
        assert!(map(&c, &paths(&text, Path::new("/fsx")))
            .unwrap_err()
            .to_string()
            .contains("`data.dataset_dir`"));
    }

    #[test]
    fn a_copy_needs_a_mounted_render_folder() {
        let c = cluster("  mounts: [\"/fsx/data:/data\", \"/fsx/cfg:/cfg\", \"/fsx/out:/fsx/out\", \"/fsx/work:/fsx/work\"]\n");
        let e = map(&c, &paths(CFG, Path::new("/fsx/work")))
            .unwrap_err()
            .to_string();
        assert!(e.contains("render folder /fsx/jobs"), "{e}");
    }
}
