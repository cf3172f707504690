//! Training samples for `model.channels: bag` (DINO Bag-of-Channels): every channel of every
//! training image is its own single-channel sample through the whole multi-crop pipeline. An
//! item is `image · C + channel`, so the sampler, the loader and the per-sample augmentation
//! seeds work on items exactly as they work on images. The augmentation normalises with mean
//! 0 and std 1 (the identity), and each crop is then normalised with its own channel's
//! mean/std, which is the same as normalising last with that channel's statistics.
use crate::data::ImageChw;
use std::cell::RefCell;
use std::sync::Arc;
use tch::{Device, Tensor};

/// Reads image `i` into `out`; false when it is to be skipped.
pub type ReadFn<E> = dyn Fn(usize, &mut ImageChw) -> Result<bool, E> + Send + Sync;

pub struct BagOfChannels {
    channels: usize,
    mean: Vec<f32>,
    std: Vec<f32>,
}

impl BagOfChannels {
    /// `mean`/`std`: one value per channel of the training images.
    pub fn new(mean: &[f32], std: &[f32]) -> Self {
        assert_eq!(mean.len(), std.len());
        Self {
            channels: mean.len(),
            mean: mean.to_vec(),
            std: std.to_vec(),
        }
    }

    /// The items of `images`: each image's channels, in channel order.
    pub fn items(&self, images: &[usize]) -> Vec<usize> {
        let c = self.channels;
        images
            .iter()
            .flat_map(|&i| (0..c).map(move |k| i * c + k))
            .collect()
    }

    /// The images behind `items`, each once, in the order first needed (what a streaming
    /// source should fetch ahead).
    pub fn images_of(&self, items: &[usize]) -> Vec<usize> {
        let mut seen = std::collections::HashSet::new();
        items
            .iter()
            .map(|&it| it / self.channels)
            .filter(|&i| seen.insert(i))
            .collect()
    }

    /// Reads item `image · C + k` as the single channel k of the image `inner` reads (the
    /// training loader's reader, `train::input::ImageFn`, whatever its error).
    pub fn image_fn<E: 'static>(&self, inner: Arc<ReadFn<E>>) -> Arc<ReadFn<E>> {
        thread_local! {
            static FULL: RefCell<ImageChw> = RefCell::new(ImageChw::default());
        }
        let c = self.channels;
        Arc::new(move |item: usize, out: &mut ImageChw| -> Result<bool, E> {
            FULL.with(|full| {
                let full = &mut *full.borrow_mut();
                if !inner(item / c, full)? {
                    return Ok(false);
                }
                let plane = full.height * full.width;
                let k = item % c;
                out.channels = 1;
                out.height = full.height;
                out.width = full.width;
                out.data.clear();
                out.data
                    .extend_from_slice(&full.data[k * plane..(k + 1) * plane]);
                Ok(true)
            })
        })
    }

    /// The augmentation's normalisation: the identity (see the module doc).
    pub fn augment_mean_std() -> (Vec<f32>, Vec<f32>) {
        (vec![0.0], vec![1.0])
    }

    /// Normalises each crop row with the mean/std of its item's channel.
    pub fn normalise(&self, items: &[usize], crops: Vec<Tensor>) -> Vec<Tensor> {
        let pick =
            |v: &[f32]| -> Vec<f32> { items.iter().map(|&it| v[it % self.channels]).collect() };
        let (m, s) = (pick(&self.mean), pick(&self.std));
        crops
            .into_iter()
            .map(|crop| {
                let shape = [crop.size()[0], 1, 1, 1];
                let dev: Device = crop.device();
                let m = Tensor::from_slice(&m).reshape(shape).to_device(dev);
                let s = Tensor::from_slice(&s).reshape(shape).to_device(dev);
                (crop - m) / s
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_map_back_to_images_and_channels() {
        let bag = BagOfChannels::new(&[0.1, 0.2, 0.3], &[1.0, 2.0, 4.0]);
        let items = bag.items(&[4, 0]);
        assert_eq!(items, vec![12, 13, 14, 0, 1, 2]);
        assert_eq!(bag.images_of(&[14, 0, 12, 2, 7]), vec![4, 0, 2]);
        let crops = vec![Tensor::ones([2, 1, 2, 2], (tch::Kind::Float, Device::Cpu))];
        let n = bag.normalise(&[13, 2], crops);
        assert_eq!(
            Vec::<f32>::try_from(n[0].flatten(0, -1)).unwrap(),
            [0.4, 0.4, 0.4, 0.4, 0.175, 0.175, 0.175, 0.175]
        );
    }

    #[test]
    fn an_item_reads_one_channel_of_its_image() {
        let bag = BagOfChannels::new(&[0.0; 3], &[1.0; 3]);
        let inner: Arc<ReadFn<String>> = Arc::new(|i: usize, out: &mut ImageChw| {
            *out = ImageChw::new(3, 1, 2, (0..6).map(|v| (i * 10 + v) as f32).collect()).unwrap();
            Ok(true)
        });
        let read = bag.image_fn(inner);
        let mut out = ImageChw::default();
        assert!(read(2 * 3 + 1, &mut out).unwrap());
        assert_eq!((out.channels, out.height, out.width), (1, 1, 2));
        assert_eq!(out.data, vec![22.0, 23.0]);
    }
}
