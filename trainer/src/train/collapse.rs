//! Collapse detection. DINO can converge to a trivial solution that the loss alone does not
//! flag: *uniform* collapse (the teacher's distribution flattens, the loss sits at
//! ln(out_dim) and the student learns nothing) and *one-prototype* collapse (every image maps
//! to the same prototype). Neither scDINO nor DINO checks for them, so a cluster run can burn
//! its whole allocation on one. Every logged interval we reduce the step's teacher signals
//! across ranks (teacher entropy, student–teacher KL, prototypes in use); a state that
//! persists for [`PATIENCE`] logged intervals after the warm-ups is named with remedies.
//!
//! The KL needs no second pass: the DINO loss is the mean cross-entropy H(p_t, p_s) over the
//! (teacher crop, other crop) pairs, each teacher crop in the same number of pairs, and
//! H(p_t, p_s) = H(p_t) + KL(p_t ‖ p_s), so mean KL = loss − mean teacher entropy.
//!
//! What a detected collapse does is `train.on_collapse` ([`CollapsePolicy`]): a warning, or a
//! stop with a checkpoint at the exact position.
use super::loss::TeacherStats;
use crate::config::{OnCollapse, TrainSection};
use crate::distributed::group::DistError;
use crate::distributed::Collective;
use tch::{Kind, Tensor};

/// Logged intervals in a row a collapsed state must last before it is reported.
pub const PATIENCE: usize = 3;
/// Uniform collapse: loss and teacher entropy both within this fraction of ln(out_dim).
pub const UNIFORM_MARGIN: f64 = 0.02;
/// One-prototype collapse needs at least this many teacher rows (all ranks) with one argmax.
pub const MIN_ROWS_FOR_ONE_PROTOTYPE: i64 = 8;

/// The teacher-side signals of one step, reduced over every rank.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TeacherSnapshot {
    /// The step's global DINO loss.
    pub loss: f64,
    /// Mean entropy (nats) of the centred, sharpened teacher distribution.
    pub teacher_entropy: f64,
    /// Mean KL(teacher ‖ student) = loss − teacher entropy.
    pub kl: f64,
    /// Distinct prototypes that are some teacher row's argmax, over all ranks' rows.
    pub prototypes_in_use: usize,
    pub out_dim: usize,
    /// Teacher rows over all ranks.
    pub rows: i64,
}

impl TeacherSnapshot {
    /// Sums the per-rank statistics over `group` (every rank must call this at the same
    /// iteration) and derives the snapshot; `loss` is the already global loss.
    pub fn gather(
        stats: &TeacherStats,
        loss: f64,
        group: &mut dyn Collective,
    ) -> Result<Self, DistError> {
        let out_dim = stats.usage.size()[0];
        let mut packed = Tensor::cat(
            &[
                stats.entropy_sum.to_kind(Kind::Double),
                Tensor::from_slice(&[stats.rows as f64]).to_device(stats.usage.device()),
                stats.usage.to_kind(Kind::Double),
            ],
            0,
        );
        group.all_reduce_sum(&mut packed)?;
        let packed = packed.to_device(tch::Device::Cpu);
        let entropy_sum = packed.double_value(&[0]);
        let rows = packed.double_value(&[1]).round() as i64;
        let prototypes_in_use = packed
            .narrow(0, 2, out_dim)
            .gt(0.0)
            .sum(Kind::Int64)
            .int64_value(&[]) as usize;
        let teacher_entropy = entropy_sum / rows.max(1) as f64;
        Ok(Self {
            loss,
            teacher_entropy,
            kl: loss - teacher_entropy,
            prototypes_in_use,
            out_dim: out_dim as usize,
            rows,
        })
    }

    /// Which collapse, if any, this one snapshot shows.
    pub fn collapse(&self) -> Option<CollapseKind> {
        let uniform = (self.out_dim as f64).ln();
        let near =
            |v: f64| v >= (1.0 - UNIFORM_MARGIN) * uniform && v <= (1.0 + UNIFORM_MARGIN) * uniform;
        if near(self.loss) && near(self.teacher_entropy) {
            Some(CollapseKind::Uniform)
        } else if self.prototypes_in_use <= 1 && self.rows >= MIN_ROWS_FOR_ONE_PROTOTYPE {
            Some(CollapseKind::OnePrototype)
        } else {
            None
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CollapseKind {
    Uniform,
    OnePrototype,
}

impl CollapseKind {
    pub fn name(self) -> &'static str {
        match self {
            CollapseKind::Uniform => "uniform collapse",
            CollapseKind::OnePrototype => "one-prototype collapse",
        }
    }
}

/// Watches the logged snapshots of one run; reports each kind of collapse once, when it has
/// lasted [`PATIENCE`] logged intervals from `start_iteration` on.
#[derive(Debug, Clone)]
pub struct CollapseWatch {
    start_iteration: usize,
    streak: Option<(CollapseKind, usize)>,
    reported: Vec<CollapseKind>,
}

impl CollapseWatch {
    /// `start_iteration`: the first iteration after the lr and teacher-temperature warm-ups
    /// (at least one epoch); an untrained head can look collapsed.
    pub fn new(start_iteration: usize) -> Self {
        Self {
            start_iteration,
            streak: None,
            reported: Vec::new(),
        }
    }

    /// Feeds the snapshot logged at `iteration`; returns a collapse to report now.
    pub fn observe(&mut self, iteration: usize, s: &TeacherSnapshot) -> Option<CollapseKind> {
        if iteration < self.start_iteration {
            return None;
        }
        self.streak = match (s.collapse(), self.streak) {
            (None, _) => None,
            (Some(k), Some((prev, n))) if k == prev => Some((k, n + 1)),
            (Some(k), _) => Some((k, 1)),
        };
        match self.streak {
            Some((k, n)) if n >= PATIENCE && !self.reported.contains(&k) => {
                self.reported.push(k);
                Some(k)
            }
            _ => None,
        }
    }
}

/// The warning or error text: what was seen, and what to change.
pub fn describe(kind: CollapseKind, s: &TeacherSnapshot, iteration: usize) -> String {
    let what = match kind {
        CollapseKind::Uniform => format!(
            "loss {:.4} and teacher entropy {:.4} sit at ln(out_dim) = {:.4} for {PATIENCE} \
             logged intervals: the teacher's output is flat and the student learns nothing",
            s.loss,
            s.teacher_entropy,
            (s.out_dim as f64).ln()
        ),
        CollapseKind::OnePrototype => format!(
            "every one of {} teacher rows picks the same prototype (teacher entropy {:.4}) for \
             {PATIENCE} logged intervals: all images map to one output",
            s.rows, s.teacher_entropy
        ),
    };
    let remedies = match kind {
        CollapseKind::Uniform => {
            "remedies: BatchNorm in the head (model.use_bn_in_head: true), a sharper \
             teacher (lower train.teacher_temp and train.warmup_teacher_temp, e.g. 0.02), a \
             smaller model.out_dim for small datasets, a lower train.momentum_teacher for \
             short runs (e.g. 0.99), or a lower train.lr; DINOv2's stabilisers \
             (train.centering: sinkhorn_knopp, train.koleo_weight: 0.1, train.ibot.weight: \
             1.0, model.num_register_tokens: 4) kept scDINO's defaults from this collapse on \
             a small dataset and, added to configs/digits.yaml, learned faster: \
             configs/small-data.yaml is that recipe; see docs/training.md, \"Collapse\""
        }
        CollapseKind::OnePrototype => {
            "remedies: a softer teacher (higher train.teacher_temp), a higher \
             train.momentum_teacher, a lower train.lr or a longer train.warmup_epochs; see \
             docs/training.md, \"Collapse\""
        }
    };
    format!(
        "{} at iteration {iteration}: {what}; {remedies}",
        kind.name()
    )
}

/// What `train.on_collapse` makes of a reported collapse. `warn` logs it (once, on rank 0:
/// every rank sees the same global snapshot) and trains on; `stop` ends the run with a
/// checkpoint at the exact position, so the run can be inspected or resumed with other
/// settings.
#[derive(Debug, Clone)]
pub struct CollapsePolicy {
    watch: CollapseWatch,
    on_collapse: OnCollapse,
    warns: bool,
    /// A collapse to stop on, seen on an epoch's last batch: the end-of-epoch checkpoint and
    /// log line are the exact position there, so the stop waits for them.
    after_epoch: Option<String>,
}

impl CollapsePolicy {
    pub fn new(train: &TrainSection, iters_per_epoch: usize, rank: usize) -> Self {
        // Collapse is judged once the lr and teacher-temperature warm-ups are over (and never
        // in the first epoch, where an untrained head can look flat).
        let warmups = (train.warmup_epochs)
            .max(train.warmup_teacher_temp_epochs)
            .max(1);
        Self {
            watch: CollapseWatch::new(warmups * iters_per_epoch),
            on_collapse: train.on_collapse,
            warns: rank == 0,
            after_epoch: None,
        }
    }

    /// Feeds the snapshot logged at `iteration`. Returns the error text when the run must
    /// stop at this step (after checkpointing it); on an epoch's last batch
    /// (`last_in_epoch`) a stop is kept for [`Self::stop_after_epoch`] instead.
    pub fn observe(
        &mut self,
        iteration: usize,
        teacher: &TeacherSnapshot,
        last_in_epoch: bool,
    ) -> Option<String> {
        let kind = self.watch.observe(iteration, teacher)?;
        let text = describe(kind, teacher, iteration);
        match self.on_collapse {
            OnCollapse::Warn => {
                if self.warns {
                    tracing::warn!("{text} (train.on_collapse: stop would end the run here)");
                }
                None
            }
            OnCollapse::Stop if !last_in_epoch => Some(text),
            OnCollapse::Stop => {
                self.after_epoch = Some(text);
                None
            }
        }
    }

    /// The stop [`Self::observe`] kept for after the epoch's checkpoint and log line.
    pub fn stop_after_epoch(&mut self) -> Option<String> {
        self.after_epoch.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(loss: f64, entropy: f64, protos: usize) -> TeacherSnapshot {
        TeacherSnapshot {
            loss,
            teacher_entropy: entropy,
            kl: loss - entropy,
            prototypes_in_use: protos,
            out_dim: 1024,
            rows: 64,
        }
    }

    #[test]
    fn classifies_uniform_and_one_prototype_and_healthy() {
        let ln = 1024f64.ln();
        assert_eq!(
            snap(ln, ln * 0.999, 3).collapse(),
            Some(CollapseKind::Uniform)
        );
        assert_eq!(
            snap(0.3, 0.01, 1).collapse(),
            Some(CollapseKind::OnePrototype)
        );
        // A sharp but diverse teacher is healthy; so is a loss near ln K with a sharp teacher.
        assert_eq!(snap(2.0, 0.5, 40).collapse(), None);
        assert_eq!(snap(ln, 2.0, 40).collapse(), None);
        // Too few rows to call one shared argmax a collapse.
        let mut few = snap(0.3, 0.01, 1);
        few.rows = 4;
        assert_eq!(few.collapse(), None);
    }

    /// The documented thresholds, at their edges (docs/training.md, "Collapse"): within 2 % of
    /// ln(out_dim) on both sides for loss and teacher entropy, at least 8 teacher rows for one
    /// prototype, and 3 logged intervals in a row. A change to any constant fails here.
    #[test]
    fn thresholds_hold_at_their_edges() {
        let ln = 1024f64.ln();
        for f in [0.981, 0.99, 1.0, 1.01, 1.019] {
            assert_eq!(
                snap(ln * f, ln * f, 40).collapse(),
                Some(CollapseKind::Uniform),
                "{f}"
            );
        }
        for f in [0.979, 1.021] {
            assert_eq!(snap(ln * f, ln, 40).collapse(), None, "loss at {f}");
            assert_eq!(snap(ln, ln * f, 40).collapse(), None, "entropy at {f}");
        }
        let mut rows = snap(0.3, 0.01, 1);
        rows.rows = 8;
        assert_eq!(rows.collapse(), Some(CollapseKind::OnePrototype));
        rows.rows = 7;
        assert_eq!(rows.collapse(), None);
        let mut two = snap(0.3, 0.01, 2);
        two.rows = 1000;
        assert_eq!(
            two.collapse(),
            None,
            "two prototypes in use are no collapse"
        );
        for kind_snap in [snap(ln, ln, 40), snap(0.3, 0.01, 1)] {
            let mut w = CollapseWatch::new(0);
            assert_eq!(w.observe(1, &kind_snap), None);
            assert_eq!(w.observe(2, &kind_snap), None);
            assert!(w.observe(3, &kind_snap).is_some(), "third interval");
        }
        // Judging starts at the given iteration, inclusive.
        let mut w = CollapseWatch::new(5);
        let flat = snap(ln, ln, 2);
        assert_eq!(w.observe(4, &flat), None);
        assert_eq!(w.observe(5, &flat), None);
        assert_eq!(w.observe(6, &flat), None);
        assert_eq!(w.observe(7, &flat), Some(CollapseKind::Uniform));
    }

    #[test]
    fn reports_after_patience_once_and_not_before_the_start() {
        let ln = 1024f64.ln();
        let flat = snap(ln, ln, 2);
        let mut w = CollapseWatch::new(100);
        assert_eq!(w.observe(10, &flat), None);
        assert_eq!(w.observe(20, &flat), None);
        assert_eq!(w.observe(30, &flat), None, "before the warm-ups end");
        assert_eq!(w.observe(100, &flat), None);
        assert_eq!(w.observe(110, &flat), None);
        // An interruption resets the streak.
        assert_eq!(w.observe(120, &snap(2.0, 0.5, 40)), None);
        assert_eq!(w.observe(130, &flat), None);
        assert_eq!(w.observe(140, &flat), None);
        assert_eq!(w.observe(150, &flat), Some(CollapseKind::Uniform));
        assert_eq!(w.observe(160, &flat), None, "reported once");
        let text = describe(CollapseKind::Uniform, &flat, 150);
        assert!(text.contains("uniform collapse at iteration 150"), "{text}");
        assert!(text.contains("teacher_temp"), "{text}");
        // The measured remedies (BENCHMARKS.md, "Which recipe learns on small real data").
        for named in [
            "train.centering: sinkhorn_knopp",
            "train.ibot.weight",
            "configs/small-data.yaml",
        ] {
            assert!(text.contains(named), "{named}: {text}");
        }
    }

    #[test]
    fn gather_on_one_process_matches_a_direct_computation() {
        let loss = super::super::loss::DinoLoss::new(16, 4, vec![0.5], tch::Device::Cpu);
        let teacher =
            Tensor::from_slice(&(0..64).map(|i| ((i * 7) % 13) as f32).collect::<Vec<_>>())
                .reshape([4, 16]);
        let stats = loss.targets(&teacher, 0).stats();
        let s = TeacherSnapshot::gather(&stats, 3.0, &mut crate::distributed::Single).unwrap();
        let p = (&teacher / 0.5).softmax(-1, Kind::Double);
        let entropy = -(&p * p.log()).sum(Kind::Double).double_value(&[]) / 4.0;
        assert!(
            (s.teacher_entropy - entropy).abs() < 1e-5,
            "{} vs {entropy}",
            s.teacher_entropy
        );
        assert!((s.kl - (3.0 - entropy)).abs() < 1e-5);
        let argmax: std::collections::BTreeSet<i64> =
            Vec::<i64>::try_from(teacher.argmax(-1, false))
                .unwrap()
                .into_iter()
                .collect();
        assert_eq!(s.prototypes_in_use, argmax.len());
        assert_eq!((s.rows, s.out_dim), (4, 16));
    }
}
