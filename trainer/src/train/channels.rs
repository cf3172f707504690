//! The channels a `tokens` step trains on: the mode's own draw (ChannelViT's hierarchical
//! channel sampling, [`crate::model::channels::hierarchical_sample`]) or DiChaViT's diverse
//! channel sampling ([`diverse_sample`], `model.dichavit.sampling: diverse`), and among which
//! channels when a batch's cells bring their own ([`step_channels`]). Every draw depends only
//! on the run's seed, the iteration (and the channel embeddings): every rank takes the same
//! subset in the same step, and a resumed run draws what a straight one would.
use crate::config::{ChannelSampling, Config, TeacherChannels};
use crate::model::channels::for_mode;
use crate::model::VisionTransformer;
use scdino_base::rng::SplitMix64;
use tch::{Device, Kind, Tensor};

/// DiChaViT's diverse channel sampling (`hcs_sampling="lowest_cosine_prob"`,
/// `models/dichavit.py`): k uniform on 1..=C and a uniform anchor channel, then k channels
/// drawn without replacement with probabilities [`diverse_probabilities`] of the anchor's row
/// of `cosines` (the channel embeddings' cosine similarities, [`channel_cosines`]), and the
/// anchor put in the last drawn place when it was not drawn. Channels unlike the anchor are
/// favoured, so a step sees channels the model tells apart least often together less rarely
/// than hierarchical sampling would. Like [`crate::model::channels::hierarchical_sample`] it depends only on the seed,
/// the iteration and the embeddings (the same on every rank), in its own stream.
pub fn diverse_sample(
    seed: u64,
    iteration: usize,
    cosines: &[Vec<f64>],
    temperature: f64,
) -> Vec<i64> {
    let channels = cosines.len();
    assert!(channels > 0, "a model has at least one channel");
    let mut r = SplitMix64::new(
        seed ^ 0x5D1C_4A7B_E2F0_9163 ^ (iteration as u64).wrapping_mul(0xA24B_AED4_963E_E407),
    );
    let k = 1 + r.below(channels as u64) as usize;
    let anchor = r.below(channels as u64) as usize;
    let mut weights = diverse_probabilities(&cosines[anchor], temperature);
    let mut chosen = Vec::with_capacity(k);
    for _ in 0..k {
        // `torch.multinomial(prob, k, replacement=False)`: each draw in proportion to the
        // weights not drawn yet.
        let total: f64 = weights.iter().sum();
        let mut u = unit(&mut r) * total;
        let pick = (0..channels)
            .filter(|&j| weights[j] > 0.0)
            .find(|&j| {
                u -= weights[j];
                u < 0.0
            })
            // Rounding can leave u at the very end: the last channel still available.
            .or_else(|| (0..channels).rev().find(|&j| weights[j] > 0.0))
            .expect("k ≤ C draws leave a channel to draw");
        weights[pick] = 0.0;
        chosen.push(pick as i64);
    }
    if !chosen.contains(&(anchor as i64)) {
        *chosen.last_mut().expect("k ≥ 1") = anchor as i64;
    }
    chosen.sort_unstable();
    chosen
}

/// Uniform in [0, 1), 53 bits.
fn unit(r: &mut SplitMix64) -> f64 {
    (r.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// softmax((1 − cos(e_anchor, e_j))/t) over the channels j, from the anchor's row of cosines:
/// the probabilities diverse sampling draws with. A weight that underflows is kept at the
/// smallest positive value, so every channel stays drawable (torch refuses to draw k
/// channels from fewer than k positive weights).
pub fn diverse_probabilities(anchor_cosines: &[f64], temperature: f64) -> Vec<f64> {
    let scores: Vec<f64> = anchor_cosines
        .iter()
        .map(|c| (1.0 - c) / temperature)
        .collect();
    let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let exp: Vec<f64> = scores
        .iter()
        .map(|s| (s - max).exp().max(f64::MIN_POSITIVE))
        .collect();
    let total: f64 = exp.iter().sum();
    exp.into_iter().map(|e| e / total).collect()
}

/// The cosine similarity of every pair of rows of `embeddings` (`[C, D]`, a model's channel
/// embeddings), in f64 on the host: what [`diverse_sample`] reads.
pub fn channel_cosines(embeddings: &Tensor) -> Vec<Vec<f64>> {
    let e = tch::no_grad(|| embeddings.to_device(Device::Cpu).to_kind(Kind::Double));
    let e = &e / e.norm_scalaropt_dim(2.0, [1], true).clamp_min(1e-12);
    let c = e.size()[0];
    let flat = Vec::<f64>::try_from(e.mm(&e.tr()).flatten(0, 1)).expect("f64 cosines");
    flat.chunks(c as usize).map(<[f64]>::to_vec).collect()
}

/// The channels step `iteration` of a run trains on: DiChaViT's diverse sampling over the
/// `student`'s channel embeddings when `model.dichavit.sampling` asks for it, else the
/// mode's own ([`crate::model::channels::ChannelModeKind::step_channels`]); None where every step trains on every
/// channel. `among`: the channels the batch's cells hold (`data.screen.cell_channels: own`),
/// the step's are drawn among them as among all `k` when every cell holds every channel.
pub fn step_channels(
    cfg: &Config,
    iteration: usize,
    k: usize,
    student: &VisionTransformer,
    among: Option<&[usize]>,
) -> Option<Vec<i64>> {
    let d = &cfg.model.dichavit;
    let drawn = match (d.sampling, student.channel_patch_embed()) {
        (ChannelSampling::Diverse, Some(embed)) => {
            let all = channel_cosines(&embed.channel_embeddings());
            let cosines = match among {
                Some(set) => set
                    .iter()
                    .map(|&a| set.iter().map(|&b| all[a][b]).collect())
                    .collect(),
                None => all,
            };
            Some(diverse_sample(
                cfg.run.seed,
                iteration,
                &cosines,
                d.sampling_temperature,
            ))
        }
        _ => for_mode(cfg.model.channels).step_channels(
            cfg.run.seed,
            iteration,
            among.map_or(k, <[usize]>::len),
        ),
    }?;
    Some(match among {
        Some(set) => drawn.iter().map(|&c| set[c as usize] as i64).collect(),
        None => drawn,
    })
}

/// The channels the teacher sees in a step whose student trains on `student`
/// (`train.teacher_channels`): None where they are the student's (`step`, or a step without
/// a subset); with `all`, every channel the batch's cells hold (`among`, else all `k`).
pub fn teacher_channels(
    cfg: &Config,
    student: Option<&[i64]>,
    k: usize,
    among: Option<&[usize]>,
) -> Option<Vec<i64>> {
    match (cfg.train.teacher_channels, student) {
        (TeacherChannels::All, Some(_)) => Some(match among {
            Some(set) => set.iter().map(|&c| c as i64).collect(),
            None => (0..k as i64).collect(),
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::teacher_channels;
    use crate::config::Config;

    fn tokens(teacher: &str) -> Config {
        Config::from_yaml(
            &format!("data:\n  channel_names: [a, b, c, d]\n  channel_combinations: [\"0123\"]\nmodel:\n  channels: tokens\ntrain:\n  teacher_channels: {teacher}\n"),
            "t.yaml",
        )
        .unwrap()
    }

    /// `all` gives every channel, or the batch's own ones when its cells bring them; `step`
    /// and a step without a subset leave the teacher on the student's channels.
    #[test]
    fn the_teacher_sees_the_batch_channels_only_with_all() {
        let all = tokens("all");
        assert_eq!(
            teacher_channels(&all, Some(&[1]), 4, None),
            Some(vec![0, 1, 2, 3])
        );
        assert_eq!(
            teacher_channels(&all, Some(&[3]), 4, Some(&[1, 3])),
            Some(vec![1, 3])
        );
        assert_eq!(teacher_channels(&all, None, 4, None), None);
        assert_eq!(teacher_channels(&tokens("step"), Some(&[1]), 4, None), None);
    }
}
