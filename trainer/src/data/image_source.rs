//! Where the dataset's images come from.
//!
//! Every consumer (training, mean/std, features, attention, probes) reads images through an
//! [`ImageSource`], never through file paths, so that a local or FSx directory, an object
//! store and packed shards are interchangeable. Whatever the source, [`ImageSource::index`]
//! is the same `ImageFolder` enumeration (order, classes, labels), so seeded splits pick the
//! same images from every source.
use super::data_error::DataError;
use super::index::{build_index, DatasetIndex};
use super::tiff_reader::{decode_tiff_into, ImageChw};
use std::path::Path;
use std::sync::Arc;

/// A dataset that can be read by sample position, from any thread.
pub trait ImageSource: Send + Sync {
    /// The samples in `ImageFolder` order. `samples[i].path` names the image in errors and in
    /// the feature files (`image_paths.csv`), also for sources that are not local files.
    fn index(&self) -> &DatasetIndex;

    /// The encoded bytes (a TIFF file) of sample `i`.
    fn read_bytes(&self, i: usize) -> Result<Vec<u8>, DataError>;

    /// [`Self::read_bytes`] into `buf`, reusing its allocation where the source can (local
    /// files and shards); streamed objects arrive in buffers of their own.
    fn read_bytes_into(&self, i: usize, buf: &mut Vec<u8>) -> Result<(), DataError> {
        *buf = self.read_bytes(i)?;
        Ok(())
    }

    /// Sample `i` decoded into `out`, with `bytes` as the read buffer; both keep their
    /// allocations, so a loader thread that reuses them allocates nothing per sample (for
    /// uncompressed TIFFs from local files or shards).
    fn read_into(
        &self,
        i: usize,
        bytes: &mut Vec<u8>,
        out: &mut ImageChw,
    ) -> Result<(), DataError> {
        self.read_bytes_into(i, bytes)?;
        decode_tiff_into(bytes, &self.index().samples[i].path, out)
            .map_err(|e| self.locate_error(i, e))
    }

    /// Adds where sample `i` is stored to a decoding error (e.g. its shard), for sources
    /// whose sample paths alone do not say it.
    fn locate_error(&self, _i: usize, e: DataError) -> DataError {
        e
    }

    /// Sample `i`, decoded to C×H×W `f32`.
    fn read(&self, i: usize) -> Result<ImageChw, DataError> {
        let mut out = ImageChw::default();
        self.read_into(i, &mut Vec::new(), &mut out)?;
        Ok(out)
    }

    /// Announces that these samples will be read next, in this order. Streaming sources
    /// start fetching ahead; local sources ignore it.
    fn will_read(&self, _order: &[usize]) {}

    /// For packed sources: per shard, the sample positions in storage order. Lets
    /// `data.order: shard_sequential` read shards front to back; `None` for loose files.
    fn shard_layout(&self) -> Option<&[Vec<usize>]> {
        None
    }

    /// For screens: per site, the positions of its cells. Lets `data.order: sites` keep a
    /// site's cells together, so a site is decoded once per epoch; `None` for other sources.
    fn site_layout(&self) -> Option<&[Vec<usize>]> {
        None
    }

    /// For sources whose cells hold different channels (a CHAMMI table under
    /// `data.screen.cell_channels: own`): the positions in `data.channel_names` of the
    /// channels sample `i` holds, ascending, which are the channels it is read with, in that
    /// order. `None` = every named channel, as for every other source.
    fn cell_channels(&self, _i: usize) -> Option<&[usize]> {
        None
    }

    /// One line for logs: what is being read and from where.
    fn describe(&self) -> String;

    /// Transfer counters for the log, for sources that have any: an object store's GETs and
    /// cache hits (totals), a screen's site reads (since the last report, i.e. per epoch).
    fn report(&self) -> Option<String> {
        None
    }
}

/// A shared handle, as the loader's worker threads hold it.
pub type SharedSource = Arc<dyn ImageSource>;

/// An `ImageFolder` tree on a local or shared (FSx, NFS) file system.
#[derive(Debug, Clone)]
pub struct LocalSource {
    index: DatasetIndex,
}

impl LocalSource {
    /// Indexes `root` (see [`build_index`]).
    pub fn open(root: &Path, label_folder_depth: usize) -> Result<Self, DataError> {
        Ok(Self {
            index: build_index(root, label_folder_depth)?,
        })
    }

    pub fn from_index(index: DatasetIndex) -> Self {
        Self { index }
    }
}

impl ImageSource for LocalSource {
    fn index(&self) -> &DatasetIndex {
        &self.index
    }

    fn read_bytes(&self, i: usize) -> Result<Vec<u8>, DataError> {
        let mut buf = Vec::new();
        self.read_bytes_into(i, &mut buf)?;
        Ok(buf)
    }

    fn read_bytes_into(&self, i: usize, buf: &mut Vec<u8>) -> Result<(), DataError> {
        use std::io::Read;
        let path = &self.index.samples[i].path;
        buf.clear();
        std::fs::File::open(path)
            .and_then(|mut f| f.read_to_end(buf))
            .map_err(|e| DataError::io(path, "reading image", e))?;
        Ok(())
    }

    fn describe(&self) -> String {
        format!(
            "{} images in {} classes from {}",
            self.index.len(),
            self.index.classes.len(),
            self.index.root.display()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::synth::{generate, SynthOptions};
    use crate::data::tiff_reader::{decode_tiff, read_tiff};
    use std::io::Cursor;

    #[test]
    fn local_source_reads_what_the_index_lists() {
        let dir = tempfile::tempdir().unwrap();
        let opts = SynthOptions {
            out: dir.path().to_path_buf(),
            seed: 3,
            classes: 2,
            per_class: 3,
            size: 16,
            channels: 2,
            donors: 1,
        };
        generate(&opts).unwrap();
        let src = LocalSource::open(&dir.path().join("Training"), 0).unwrap();
        assert_eq!(src.index().len(), 6);
        for i in 0..6 {
            let via_bytes = decode_tiff(
                Cursor::new(src.read_bytes(i).unwrap()),
                &src.index().samples[i].path,
            )
            .unwrap();
            let direct = read_tiff(&src.index().samples[i].path).unwrap();
            assert_eq!(via_bytes.data, direct.data);
            assert_eq!(src.read(i).unwrap().data, direct.data);
        }
        assert!(src.describe().contains("6 images in 2 classes"));
    }
}
