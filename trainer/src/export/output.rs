//! The export folder, written all at once: files go to a hidden folder beside the target,
//! which takes the target's place only when every file is written, so a failed or
//! interrupted export leaves the old folder (or none) and never half a model.
use super::{io, ExportError, EXPORT_FILES, MARKER};
use std::path::{Path, PathBuf};

/// A folder being filled for `target`; dropped without [`Staging::commit`], it is removed.
#[derive(Debug)]
pub struct Staging {
    target: PathBuf,
    dir: PathBuf,
    committed: bool,
}

impl Staging {
    /// Refuses a `target` that is a file, or a folder with entries unless `force` and the
    /// folder holds a previous export (nothing else is ever replaced: `--out` pointed at a
    /// run folder by mistake must not delete the run); then creates the staging folder
    /// beside it (its parent is created if missing).
    pub fn begin(target: &Path, force: bool) -> Result<Self, ExportError> {
        if target.is_file() {
            return Err(ExportError::Invalid {
                path: target.to_path_buf(),
                what: "is a file; --out names the folder to write".into(),
            });
        }
        if target.is_dir() && !force {
            let mut entries =
                std::fs::read_dir(target).map_err(io(target, "reading the output folder"))?;
            if entries.next().is_some() {
                return Err(ExportError::NotEmpty(target.to_path_buf()));
            }
        }
        if target.is_dir() && force {
            if let Err(why) = previous_export(target) {
                return Err(ExportError::NotAnExport {
                    path: target.to_path_buf(),
                    why,
                });
            }
        }
        let name = target
            .file_name()
            .ok_or_else(|| ExportError::Invalid {
                path: target.to_path_buf(),
                what: "names no folder".into(),
            })?
            .to_string_lossy()
            .into_owned();
        let parent = parent(target);
        std::fs::create_dir_all(parent).map_err(io(parent, "creating the parent folder"))?;
        let dir = parent.join(format!(".{name}.export.{}", std::process::id()));
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(io(&dir, "removing a stale staging folder"))?;
        }
        std::fs::create_dir(&dir).map_err(io(&dir, "creating the staging folder"))?;
        Ok(Self {
            target: target.to_path_buf(),
            dir,
            committed: false,
        })
    }

    /// Where file `name` is staged (for writers that take a path, e.g. TorchScript's save).
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Writes file `name` durably (see `scdino_base::fs::write_atomic`).
    pub fn write(&self, name: &str, bytes: &[u8]) -> Result<(), ExportError> {
        let path = self.path(name);
        scdino_base::fs::write_atomic(&path, bytes).map_err(io(&path, "writing"))
    }

    /// Puts the staged folder in the target's place (an existing target, allowed by
    /// `force` or empty, is moved aside first and removed after) and returns the target's
    /// files, sorted.
    pub fn commit(mut self) -> Result<Vec<PathBuf>, ExportError> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(&self.dir)
            .map_err(io(&self.dir, "listing the staging folder"))?
            .filter_map(|e| e.ok().map(|e| self.target.join(e.file_name())))
            .collect();
        files.sort();
        let old = self
            .dir
            .with_extension(format!("old.{}", std::process::id()));
        let replaced = self.target.exists();
        if replaced {
            std::fs::rename(&self.target, &old)
                .map_err(io(&self.target, "moving the old export aside"))?;
        }
        if let Err(e) = std::fs::rename(&self.dir, &self.target) {
            if replaced {
                let _ = std::fs::rename(&old, &self.target);
            }
            return Err(io(&self.target, "moving the export in place")(e));
        }
        self.committed = true;
        scdino_base::fs::sync_dir(parent(&self.target));
        if replaced {
            std::fs::remove_dir_all(&old).map_err(io(&old, "removing the old export"))?;
        }
        Ok(files)
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Ok when `dir` is empty or holds an export: only the files an export writes, and a
/// `config.json` that is ours (the marker, or for exports written before it, the TorchScript
/// `format` / timm `pretrained_cfg.tag` they carried); otherwise why not.
fn previous_export(dir: &Path) -> Result<(), String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("cannot list it: {e}"))?;
    let mut names = Vec::new();
    for e in entries {
        let e = e.map_err(|e| format!("cannot list it: {e}"))?;
        names.push(e.file_name().to_string_lossy().into_owned());
    }
    if names.is_empty() {
        return Ok(());
    }
    names.sort();
    let foreign: Vec<&String> = names
        .iter()
        .filter(|n| !EXPORT_FILES.contains(&n.as_str()))
        .collect();
    if !foreign.is_empty() {
        let shown: Vec<&str> = foreign.iter().take(5).map(|n| n.as_str()).collect();
        return Err(format!(
            "it holds {}{} besides what an export writes",
            shown.join(", "),
            if foreign.len() > shown.len() {
                ", ..."
            } else {
                ""
            }
        ));
    }
    let config = dir.join("config.json");
    let text = std::fs::read_to_string(&config)
        .map_err(|_| "it has no readable config.json, which every export writes".to_string())?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|_| "its config.json is not JSON".to_string())?;
    let ours = v.get(MARKER).is_some()
        || v["format"] == "torchscript"
        || v["pretrained_cfg"]["tag"] == "scdino";
    if ours {
        Ok(())
    } else {
        Err("its config.json was not written by `trainer export`".into())
    }
}

fn parent(path: &Path) -> &Path {
    path.parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}
