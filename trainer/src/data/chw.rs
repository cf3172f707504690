//! The decoded image type every reader produces and every stage consumes (C×H×W), kept apart
//! from the TIFF readers so the fast and the general decoder both depend on it and not on each
//! other.
use super::data_error::DataError;

/// A multi-channel image stored channel-major (C×H×W, row-major), the layout
/// the model consumes (`torch.from_numpy(x).permute(2, 0, 1)` in scDINO).
#[derive(Debug, Clone, PartialEq)]
pub struct Chw<T> {
    pub channels: usize,
    pub height: usize,
    pub width: usize,
    /// `channels * height * width` values; index `(c * height + y) * width + x`.
    pub data: Vec<T>,
}

/// The decoded image as the rest of the pipeline sees it.
pub type ImageChw = Chw<f32>;
/// A raw 16-bit image, as stored in the PBMC files and written by `synth`.
pub type ImageChwU16 = Chw<u16>;

impl<T: Copy> Chw<T> {
    /// Build an image, checking that `data` has exactly C·H·W values.
    pub fn new(
        channels: usize,
        height: usize,
        width: usize,
        data: Vec<T>,
    ) -> Result<Self, DataError> {
        let expected = checked_len(channels, height, width)?;
        if data.len() != expected {
            return Err(DataError::InvalidArgument(format!(
                "image data has {} values, expected {channels}×{height}×{width} = {expected}",
                data.len()
            )));
        }
        Ok(Chw {
            channels,
            height,
            width,
            data,
        })
    }

    /// Number of values in one channel plane (H·W).
    pub fn plane_len(&self) -> usize {
        self.height * self.width
    }

    /// The H·W values of channel `c`. Panics if `c >= channels` (a programming
    /// error, not a data error; use [`Chw::try_channel`] for untrusted indices).
    pub fn channel(&self, c: usize) -> &[T] {
        let n = self.plane_len();
        &self.data[c * n..(c + 1) * n]
    }

    /// Mutable view of channel `c`; panics like [`Chw::channel`].
    pub fn channel_mut(&mut self, c: usize) -> &mut [T] {
        let n = self.plane_len();
        &mut self.data[c * n..(c + 1) * n]
    }

    /// Channel `c`, or an error if it does not exist.
    pub fn try_channel(&self, c: usize) -> Result<&[T], DataError> {
        if c < self.channels {
            Ok(self.channel(c))
        } else {
            Err(DataError::ChannelOutOfRange {
                channel: c,
                channels: self.channels,
            })
        }
    }

    /// Value at channel `c`, row `y`, column `x`.
    pub fn get(&self, c: usize, y: usize, x: usize) -> T {
        self.data[(c * self.height + y) * self.width + x]
    }

    /// The same values interleaved as H×W×C, i.e. what `tifffile.imread`
    /// returns for the PBMC files (handy for comparisons with numpy).
    pub fn to_hwc(&self) -> Vec<T> {
        let n = self.plane_len();
        let mut out = Vec::with_capacity(self.data.len());
        for p in 0..n {
            for c in 0..self.channels {
                out.push(self.data[c * n + p]);
            }
        }
        out
    }

    /// Inverse of [`Chw::to_hwc`].
    pub fn from_hwc(
        channels: usize,
        height: usize,
        width: usize,
        hwc: &[T],
    ) -> Result<Self, DataError> {
        let expected = checked_len(channels, height, width)?;
        if hwc.len() != expected {
            return Err(DataError::InvalidArgument(format!(
                "HWC data has {} values, expected {expected}",
                hwc.len()
            )));
        }
        let n = height * width;
        let mut data = Vec::with_capacity(expected);
        for c in 0..channels {
            data.extend((0..n).map(|p| hwc[p * channels + c]));
        }
        Ok(Chw {
            channels,
            height,
            width,
            data,
        })
    }
}

pub(crate) fn checked_len(
    channels: usize,
    height: usize,
    width: usize,
) -> Result<usize, DataError> {
    channels
        .checked_mul(height)
        .and_then(|v| v.checked_mul(width))
        .ok_or_else(|| {
            DataError::InvalidArgument(format!("image size {channels}×{height}×{width} overflows"))
        })
}

/// An empty image, for callers that decode into reused buffers.
impl<T> Default for Chw<T> {
    fn default() -> Self {
        Self {
            channels: 0,
            height: 0,
            width: 0,
            data: Vec::new(),
        }
    }
}
