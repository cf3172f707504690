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
    let n = among.map_or(k, <[usize]>::len);
    // Config allows the fraction above 0 with `tokens` only, the one mode that draws.
    let alone = single_channel_step(cfg.run.seed, iteration, n, cfg.train.single_channel_steps);
    let drawn = match (alone, d.sampling, student.channel_patch_embed()) {
        (Some(channel), ..) => Some(vec![channel]),
        (None, ChannelSampling::Diverse, Some(embed)) => {
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
        _ => for_mode(cfg.model.channels).step_channels(cfg.run.seed, iteration, n),
    }?;
    Some(match among {
        Some(set) => drawn.iter().map(|&c| set[c as usize] as i64).collect(),
        None => drawn,
    })
}

/// `train.single_channel_steps`: the one channel (of `channels`) step `iteration` trains on
/// alone, drawn with probability `fraction` and then uniformly; None for a step left to the
/// sampler. Its own stream (not hierarchical or diverse sampling's), so at 0 every step
/// draws what it drew before the key existed, and a resumed run draws what a straight one
/// would.
pub fn single_channel_step(
    seed: u64,
    iteration: usize,
    channels: usize,
    fraction: f64,
) -> Option<i64> {
    if fraction <= 0.0 || channels == 0 {
        return None;
    }
    let mut r = SplitMix64::new(
        seed ^ 0x3C6E_F372_FE94_F82B ^ (iteration as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
    );
    (unit(&mut r) < fraction).then(|| r.below(channels as u64) as i64)
}

/// One line for the start of a run saying how its `tokens` steps draw their channels (None
/// for the other modes, whose steps always see every channel): a run's channel draw is set by
/// three keys in two sections, and the training logs show only its effects.
pub fn describe_channel_draw(cfg: &Config) -> Option<String> {
    if cfg.model.channels != crate::config::ChannelMode::Tokens {
        return None;
    }
    let sampler = match cfg.model.dichavit.sampling {
        ChannelSampling::Diverse => format!(
            "DiChaViT's diverse sampling (model.dichavit.sampling, temperature {})",
            cfg.model.dichavit.sampling_temperature
        ),
        _ => "ChannelViT's hierarchical sampling (a size, then a subset of that size)".into(),
    };
    let f = cfg.train.single_channel_steps;
    let alone = if f > 0.0 {
        format!(
            "; {:.0} % of the steps on one channel alone (train.single_channel_steps)",
            f * 100.0
        )
    } else {
        String::new()
    };
    let teacher = match cfg.train.teacher_channels {
        TeacherChannels::All => "every channel (train.teacher_channels: all)",
        TeacherChannels::Step => "the step's channels",
    };
    Some(format!(
        "channels per step: {sampler}{alone}; the teacher sees {teacher}"
    ))
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
    use super::{describe_channel_draw, single_channel_step, teacher_channels};
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

    /// About `fraction` of the steps draw one channel, each channel about equally often, the
    /// same for the same seed and iteration; 0 draws none and 1 every step.
    #[test]
    fn single_channel_steps_draw_the_fraction_and_every_channel() {
        let steps = 20_000;
        for fraction in [0.25, 0.5, 0.8] {
            let mut per_channel = [0usize; 5];
            for it in 0..steps {
                let drawn = single_channel_step(7, it, 5, fraction);
                assert_eq!(drawn, single_channel_step(7, it, 5, fraction));
                if let Some(c) = drawn {
                    per_channel[c as usize] += 1;
                }
            }
            let alone: usize = per_channel.iter().sum();
            // Binomial sd at 20,000 steps is at most 0.0036: five sd.
            let share = alone as f64 / steps as f64;
            assert!((share - fraction).abs() < 0.018, "{fraction}: {share}");
            for (c, &n) in per_channel.iter().enumerate() {
                let part = n as f64 / alone as f64;
                assert!((part - 0.2).abs() < 0.03, "{fraction}: channel {c} {part}");
            }
        }
        assert!((0..1000).all(|it| single_channel_step(7, it, 5, 0.0).is_none()));
        assert!((0..1000).all(|it| single_channel_step(7, it, 3, 1.0).is_some_and(|c| c < 3)));
        assert_eq!(single_channel_step(7, 0, 0, 1.0), None);
        // Another seed, another draw.
        let a: Vec<_> = (0..64)
            .map(|it| single_channel_step(1, it, 5, 0.5))
            .collect();
        let b: Vec<_> = (0..64)
            .map(|it| single_channel_step(2, it, 5, 0.5))
            .collect();
        assert_ne!(a, b);
    }

    /// The start-of-run line names the sampler, the share of single-channel steps and the
    /// teacher's channels of a `tokens` run, and nothing for the modes that do not draw.
    #[test]
    fn the_channel_draw_is_described_for_tokens_only() {
        let plain = describe_channel_draw(&tokens("step")).unwrap();
        assert_eq!(
            plain,
            "channels per step: ChannelViT's hierarchical sampling (a size, then a subset of that size); the teacher sees the step's channels"
        );
        let yaml = "data:\n  channel_names: [a, b, c, d]\n  channel_combinations: [\"0123\"]\nmodel:\n  channels: tokens\n  dichavit:\n    sampling: diverse\ntrain:\n  teacher_channels: all\n  single_channel_steps: 0.25\n";
        let all = describe_channel_draw(&Config::from_yaml(yaml, "t").unwrap()).unwrap();
        assert_eq!(
            all,
            "channels per step: DiChaViT's diverse sampling (model.dichavit.sampling, temperature 0.1); 25 % of the steps on one channel alone (train.single_channel_steps); the teacher sees every channel (train.teacher_channels: all)"
        );
        for mode in ["fixed", "bag"] {
            let c = Config::from_yaml(&format!("model:\n  channels: {mode}\n"), "t").unwrap();
            assert_eq!(describe_channel_draw(&c), None, "{mode}");
        }
    }
}
