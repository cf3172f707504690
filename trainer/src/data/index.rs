//! Dataset enumeration with torchvision `ImageFolder` semantics.
//!
//! Seeded splits select images *by position* in the `ImageFolder` sample
//! list, so to pick the same files as scDINO the list must be identical,
//! sample for sample:
//!
//! * classes = names of the immediate sub-directories of the root (symlinks to
//!   directories count, like `os.scandir(...).is_dir()`), sorted as Python
//!   strings;
//! * for each class in that order: `for root, _, fnames in
//!   sorted(os.walk(class_dir, followlinks=True))`, then `sorted(fnames)`.
//!   `sorted(os.walk(...))` orders directories by their *path string*, which
//!   is not depth-first order: `B/x-y` sorts before `B/x/z` because `-` <
//!   `/`;
//! * a sample path is `os.path.join(root, fname)`, a plain string; labels are
//!   cut from it with `path.split("/")[-depth-2]`.
//!
//! Python compares `str` by code point. On Linux, file names that are not
//! valid UTF-8 are decoded with `surrogateescape` (byte `b` → U+DC00+b); we
//! sort by the same code-point key, so even such names order like Python.
//!
//! Deliberate differences from torchvision, all documented on [`build_index`]:
//! only `.tif`/`.tiff` are indexed (torchvision would also count `.png`,
//! `.jpg`, ... which scDINO's `tifffile.imread` cannot read — we list those
//! in [`DatasetIndex::skipped_other_images`] so the caller can warn);
//! unreadable directories are errors (os.walk skips them silently); symlink
//! cycles are not re-entered (os.walk would descend until the OS refuses,
//! listing the same files many times).

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::data_error::DataError;

/// File extensions we index (compared on the lower-cased name, like
/// torchvision's `has_file_allowed_extension`).
pub const TIFF_EXTENSIONS: [&str; 2] = [".tif", ".tiff"];

/// The other extensions in torchvision's `IMG_EXTENSIONS`.
const OTHER_IMAGE_EXTENSIONS: [&str; 7] =
    [".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".webp"];

/// One image of the dataset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    /// `os.path.join(root, fname)` as Python would build it.
    pub path: PathBuf,
    /// Index into [`DatasetIndex::classes`] (the `ImageFolder` target).
    pub class_index: usize,
    /// `path.split("/")[-folder_depth_for_labels - 2]`.
    pub label: String,
}

/// The enumerated dataset: `ImageFolder(root)` plus scDINO labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DatasetIndex {
    pub root: PathBuf,
    /// `ImageFolder.classes`.
    pub classes: Vec<String>,
    /// `ImageFolder.samples`, in order.
    pub samples: Vec<Sample>,
    /// Files torchvision would have indexed too (`.png`, `.jpg`, ...) but we
    /// skipped. Non-empty means sample positions differ from scDINO's.
    pub skipped_other_images: Vec<PathBuf>,
    /// Each sample's group that a held-out split must not cut (a screen's
    /// `data.screen.split_by` value: its well, plate...); `None` for folders of images.
    pub groups: Option<Vec<String>>,
}

impl DatasetIndex {
    /// Number of samples.
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    /// True if there are no samples (cannot happen for a successful
    /// [`build_index`], which rejects empty classes).
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// The label of every sample, in sample order.
    pub fn labels(&self) -> Vec<&str> {
        self.samples.iter().map(|s| s.label.as_str()).collect()
    }

    /// Sorted unique labels: the classes of sklearn's `LabelEncoder` as the
    /// kNN stage fits it (`np.unique` order = code-point order).
    pub fn label_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.samples.iter().map(|s| s.label.clone()).collect();
        names.sort_by_cached_key(|s| python_key(OsStr::new(s)));
        names.dedup();
        names
    }

    /// Sample paths as strings, e.g. for scDINO's `image_paths.csv`.
    pub fn path_strings(&self) -> Vec<String> {
        self.samples
            .iter()
            .map(|s| s.path.to_string_lossy().into_owned())
            .collect()
    }
}

/// Sort key equal to Python's `str` ordering of an `os.fsdecode`d name:
/// code points, with undecodable bytes mapped to U+DC00+byte.
fn python_key(name: &OsStr) -> Vec<u32> {
    let mut key = Vec::with_capacity(name.len());
    for chunk in name.as_bytes().utf8_chunks() {
        key.extend(chunk.valid().chars().map(u32::from));
        key.extend(chunk.invalid().iter().map(|&b| 0xDC00 + u32::from(b)));
    }
    key
}

fn has_extension(name: &OsStr, extensions: &[&str]) -> bool {
    let lower = name.to_string_lossy().to_lowercase();
    extensions.iter().any(|ext| lower.ends_with(ext))
}

/// Python's `os.path.join(a, b)` for a relative `b`: add `/` unless `a` is
/// empty or already ends with one. (`PathBuf::join` would normalise nothing
/// else either, but spelling it out keeps the label strings exact.)
fn py_join(a: &Path, b: &OsStr) -> PathBuf {
    let mut s: OsString = a.as_os_str().to_owned();
    if !s.is_empty() && !s.as_bytes().ends_with(b"/") {
        s.push("/");
    }
    s.push(b);
    PathBuf::from(s)
}

/// Enumerate `root` like `torchvision.datasets.ImageFolder(root)` (restricted
/// to `.tif`/`.tiff`) and attach scDINO labels with `folder_depth_for_labels`
/// (0 = the immediate parent folder).
///
/// Errors: missing or non-directory root, no class folder, a class without
/// any TIFF (torchvision raises for both), an unreadable directory, or a
/// label depth that points above the start of a sample path.
pub fn build_index(root: &Path, folder_depth_for_labels: usize) -> Result<DatasetIndex, DataError> {
    let meta = std::fs::metadata(root).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => DataError::DatasetRoot {
            path: root.to_path_buf(),
            reason: "does not exist",
        },
        _ => DataError::io(root, "reading dataset root", e),
    })?;
    if !meta.is_dir() {
        return Err(DataError::DatasetRoot {
            path: root.to_path_buf(),
            reason: "is not a directory",
        });
    }
    let mut classes: Vec<OsString> = list_dir(root)?
        .into_iter()
        .filter(|(_, is_dir)| *is_dir)
        .map(|(name, _)| name)
        .collect();
    if classes.is_empty() {
        return Err(DataError::NoClassFolders {
            path: root.to_path_buf(),
        });
    }
    classes.sort_by_cached_key(|c| python_key(c));
    let mut walks = Vec::with_capacity(classes.len());
    for class in &classes {
        walks.push(walk_sorted(&py_join(root, class))?);
    }
    assemble(root, classes, walks, folder_depth_for_labels)
}

/// The index of an object-store listing: `keys` are object keys relative to the dataset
/// prefix (`Training/B/x.tif`, '/'-separated), `root` the prefix as a URL
/// (`s3://bucket/prefix`). Gives exactly what [`build_index`] gives for a local tree with the
/// same files, so a dataset copied to S3 keeps its order, labels and seeded splits. Object
/// stores have no directories: a "folder" exists when some key lies below it, and keys
/// ending in `/` (console-made folder markers) are folders, not files.
pub fn build_index_from_keys<S: AsRef<str>>(
    root: &str,
    keys: &[S],
    folder_depth_for_labels: usize,
) -> Result<DatasetIndex, DataError> {
    use std::collections::BTreeMap;
    // class -> dir (relative) -> file names
    let mut tree: BTreeMap<String, BTreeMap<String, Vec<OsString>>> = BTreeMap::new();
    for key in keys {
        let key = key.as_ref().trim_start_matches('/');
        let Some((class, rest)) = key.split_once('/') else {
            continue; // a file in the root: ImageFolder ignores it
        };
        if class.is_empty() {
            continue;
        }
        let dirs = tree.entry(class.to_string()).or_default();
        let (dir, file) = match rest.rsplit_once('/') {
            Some((d, f)) => (format!("{class}/{d}"), f),
            None => (class.to_string(), rest),
        };
        // Every folder on the way exists (os.walk lists it even if it holds no file).
        let mut p = class.to_string();
        dirs.entry(p.clone()).or_default();
        for part in dir.split('/').skip(1) {
            p = format!("{p}/{part}");
            dirs.entry(p.clone()).or_default();
        }
        if !file.is_empty() {
            dirs.entry(dir).or_default().push(OsString::from(file));
        }
    }
    let root_path = PathBuf::from(root.trim_end_matches('/'));
    if tree.is_empty() {
        return Err(DataError::NoClassFolders { path: root_path });
    }
    let mut classes: Vec<OsString> = tree.keys().map(OsString::from).collect();
    classes.sort_by_cached_key(|c| python_key(c));
    let walks = classes
        .iter()
        .map(|c| {
            let mut walk: Vec<(PathBuf, Vec<OsString>)> = tree[c.to_str().unwrap_or_default()]
                .iter()
                .map(|(d, files)| (py_join(&root_path, OsStr::new(d)), files.clone()))
                .collect();
            walk.sort_by_cached_key(|(dir, _)| python_key(dir.as_os_str()));
            walk
        })
        .collect();
    assemble(&root_path, classes, walks, folder_depth_for_labels)
}

/// Samples from sorted classes and each class's `sorted(os.walk)` (the part of the
/// `ImageFolder` enumeration shared by local trees and object-store listings).
fn assemble(
    root: &Path,
    classes: Vec<OsString>,
    walks: Vec<Vec<(PathBuf, Vec<OsString>)>>,
    folder_depth_for_labels: usize,
) -> Result<DatasetIndex, DataError> {
    let mut samples = Vec::new();
    let mut skipped_other_images = Vec::new();
    let mut empty = Vec::new();
    for (class_index, (class, walk)) in classes.iter().zip(walks).enumerate() {
        let before = samples.len();
        for (dir, mut files) in walk {
            files.sort_by_cached_key(|f| python_key(f));
            for fname in files {
                let path = py_join(&dir, &fname);
                if has_extension(&fname, &TIFF_EXTENSIONS) {
                    let label = label_for(&path, folder_depth_for_labels)?;
                    samples.push(Sample {
                        path,
                        class_index,
                        label,
                    });
                } else if has_extension(&fname, &OTHER_IMAGE_EXTENSIONS) {
                    skipped_other_images.push(path);
                }
            }
        }
        if samples.len() == before {
            empty.push(class.to_string_lossy().into_owned());
        }
    }
    if samples.is_empty() {
        return Err(DataError::EmptyClasses {
            root: root.to_path_buf(),
            classes: empty,
        });
    }
    if !empty.is_empty() {
        // torchvision raises here; a class folder emptied by a filter or a failed copy should
        // not stop a run, so it is named and keeps its class index (`allow_empty=True`).
        tracing::warn!(
            "{}: no .tif/.tiff files in the class folder(s) {}; they keep their class \
             index and have no images",
            root.display(),
            empty.join(", ")
        );
    }
    Ok(DatasetIndex {
        root: root.to_path_buf(),
        classes: classes
            .iter()
            .map(|c| c.to_string_lossy().into_owned())
            .collect(),
        samples,
        skipped_other_images,
        groups: None,
    })
}

/// scDINO's `path.split("/")[-depth-2]` (`utils.py`), with Python's
/// negative indexing: an absolute path starts with an empty component.
pub fn label_for(path: &Path, folder_depth_for_labels: usize) -> Result<String, DataError> {
    let s = path.to_string_lossy();
    let parts: Vec<&str> = s.split('/').collect();
    let from_end = folder_depth_for_labels.saturating_add(2);
    if from_end > parts.len() {
        return Err(DataError::LabelDepth {
            path: path.to_path_buf(),
            depth: folder_depth_for_labels,
            components: parts.len(),
        });
    }
    Ok(parts[parts.len() - from_end].to_string())
}

/// Entries of `dir` as (name, is_dir following symlinks).
fn list_dir(dir: &Path) -> Result<Vec<(OsString, bool)>, DataError> {
    let entries = std::fs::read_dir(dir).map_err(|e| DataError::io(dir, "listing directory", e))?;
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| DataError::io(dir, "listing directory", e))?;
        // `DirEntry::is_dir()` in Python follows symlinks; a broken symlink
        // is a non-directory (and ends up among the file names).
        let is_dir = std::fs::metadata(entry.path())
            .map(|m| m.is_dir())
            .unwrap_or(false);
        out.push((entry.file_name(), is_dir));
    }
    Ok(out)
}

/// `sorted(os.walk(top, followlinks=True))` as (dir path, file names):
/// directories ordered by their full path string (code points).
fn walk_sorted(top: &Path) -> Result<Vec<(PathBuf, Vec<OsString>)>, DataError> {
    let mut out = Vec::new();
    // Each pending directory carries the (device, inode) of its ancestors so
    // a symlink back up the tree (a cycle) is not entered again. Two links to
    // the same non-ancestor directory are both walked, as os.walk does.
    let mut stack: Vec<(PathBuf, Vec<(u64, u64)>)> = vec![(top.to_path_buf(), Vec::new())];
    while let Some((dir, mut ancestors)) = stack.pop() {
        if let Ok(m) = std::fs::metadata(&dir) {
            let id = (m.dev(), m.ino());
            if ancestors.contains(&id) {
                continue;
            }
            ancestors.push(id);
        }
        let mut files = Vec::new();
        for (name, is_dir) in list_dir(&dir)? {
            if is_dir {
                stack.push((py_join(&dir, &name), ancestors.clone()));
            } else {
                files.push(name);
            }
        }
        out.push((dir, files));
    }
    out.sort_by_cached_key(|(dir, _)| python_key(dir.as_os_str()));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn touch(p: &Path) {
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, b"x").unwrap();
    }

    fn rel(index: &DatasetIndex) -> Vec<String> {
        let root = index.root.to_string_lossy().into_owned();
        index
            .path_strings()
            .into_iter()
            .map(|p| p.strip_prefix(&root).unwrap().to_string())
            .collect()
    }

    #[test]
    fn imagefolder_order_and_labels() {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        for f in [
            "b/x/z/1.tif",
            "b/x-y/2.TIFF",
            "b/x/3.tiff",
            "b/4.tif",
            "b/notes.txt",
            "b/pic.png",
            "B/0.tif",
            "a/_.tif",
            "a/Z.tif",
        ] {
            touch(&r.join(f));
        }
        touch(&r.join("loose.tif")); // files in the root are ignored
        let index = build_index(r, 0).unwrap();
        assert_eq!(index.classes, vec!["B", "a", "b"]);
        assert_eq!(
            rel(&index),
            vec![
                "/B/0.tif",
                "/a/Z.tif",
                "/a/_.tif",
                "/b/4.tif",
                "/b/x/3.tiff",
                "/b/x-y/2.TIFF",
                "/b/x/z/1.tif"
            ]
        );
        assert_eq!(index.labels(), vec!["B", "a", "a", "b", "x", "x-y", "z"]);
        assert_eq!(index.samples[5].class_index, 2);
        assert_eq!(index.label_names(), vec!["B", "a", "b", "x", "x-y", "z"]);
        assert_eq!(index.skipped_other_images.len(), 1);
        let deep = build_index(r, 1).unwrap();
        assert_eq!(deep.samples[6].label, "x");
    }

    #[test]
    fn key_listing_indexes_like_the_local_tree() {
        let dir = tempfile::tempdir().unwrap();
        // Same last folder name as the prefix, so depth-1 labels of root-level classes agree.
        let r = &dir.path().join("pre");
        let files = [
            "b/x/z/1.tif",
            "b/x-y/2.TIFF",
            "b/x/3.tiff",
            "b/4.tif",
            "b/notes.txt",
            "b/pic.png",
            "B/0.tif",
            "a/_.tif",
            "a/Z.tif",
            "a/é/1.tif",
            "a/e/1.tif",
            "loose.tif",
        ];
        for f in files {
            touch(&r.join(f));
        }
        let local = build_index(r, 0).unwrap();
        let mut keys: Vec<String> = files.iter().map(|f| f.to_string()).collect();
        keys.push("b/x/".into()); // a folder marker
        keys.reverse(); // listing order must not matter
        for depth in [0, 1] {
            let local = build_index(r, depth).unwrap();
            let remote = build_index_from_keys("s3://bkt/pre/", &keys, depth).unwrap();
            assert_eq!(remote.classes, local.classes);
            assert_eq!(remote.root, PathBuf::from("s3://bkt/pre"));
            assert_eq!(rel(&remote), rel(&local));
            assert_eq!(remote.labels(), local.labels());
            let classes =
                |i: &DatasetIndex| i.samples.iter().map(|s| s.class_index).collect::<Vec<_>>();
            assert_eq!(classes(&remote), classes(&local));
            assert_eq!(remote.skipped_other_images.len(), 1);
        }
        assert_eq!(local.samples[0].path, r.join("B/0.tif"));
        assert!(matches!(
            build_index_from_keys("s3://b/p", &["loose.tif"], 0),
            Err(DataError::NoClassFolders { .. })
        ));
        let with_empty =
            build_index_from_keys("s3://b/p", &["A/x.tif", "C/readme.txt"], 0).unwrap();
        assert_eq!(with_empty.classes, vec!["A", "C"]);
        assert_eq!(with_empty.samples.len(), 1);
        assert!(matches!(
            build_index_from_keys("s3://b/p", &["C/readme.txt"], 0),
            Err(DataError::EmptyClasses { .. })
        ));
    }

    #[test]
    fn label_depth_python_indexing() {
        assert_eq!(label_for(Path::new("/d/B/f.tif"), 0).unwrap(), "B");
        assert_eq!(label_for(Path::new("/d/B/f.tif"), 2).unwrap(), "");
        assert!(matches!(
            label_for(Path::new("/d/B/f.tif"), 3),
            Err(DataError::LabelDepth {
                depth: 3,
                components: 4,
                ..
            })
        ));
        assert!(label_for(Path::new("B/f.tif"), 1).is_err());
    }

    #[test]
    fn errors_name_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope");
        let e = build_index(&missing, 0).unwrap_err();
        assert!(matches!(e, DataError::DatasetRoot { .. }));
        assert!(e.to_string().contains("nope"));
        assert!(matches!(
            build_index(dir.path(), 0),
            Err(DataError::NoClassFolders { .. })
        ));
        fs::create_dir(dir.path().join("Empty")).unwrap();
        match build_index(dir.path(), 0) {
            Err(DataError::EmptyClasses { classes, .. }) => assert_eq!(classes, vec!["Empty"]),
            other => panic!("{other:?}"),
        }
        // Next to a class with images, an empty class folder is a warning: it keeps its
        // index (sorted before "Full") and has no samples.
        touch(&dir.path().join("Full/a.tif"));
        let index = build_index(dir.path(), 0).unwrap();
        assert_eq!(index.classes, vec!["Empty", "Full"]);
        assert_eq!(index.samples.len(), 1);
        assert_eq!(index.samples[0].class_index, 1);
    }

    #[test]
    fn python_key_orders_surrogate_escapes_after_bmp_letters() {
        // 'é' (U+00E9) < U+DC80 in Python, although 0xC3 > 0x80 as bytes.
        let e = OsStr::new("é");
        let raw = OsStr::from_bytes(&[0x80]);
        assert!(python_key(e) < python_key(raw));
        assert!(e.as_bytes() > raw.as_bytes());
    }

    #[test]
    fn symlinked_dirs_are_followed_and_cycles_terminate() {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        touch(&r.join("A/real/1.tif"));
        std::os::unix::fs::symlink(r.join("A/real"), r.join("A/link")).unwrap();
        std::os::unix::fs::symlink(r.join("A"), r.join("A/real/loop")).unwrap();
        let index = build_index(r, 0).unwrap();
        // Both routes to the same directory are listed (as os.walk does); the
        // cycle back to A is not followed.
        assert_eq!(rel(&index), vec!["/A/link/1.tif", "/A/real/1.tif"]);
    }
}
