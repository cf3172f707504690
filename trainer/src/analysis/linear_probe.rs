//! Linear probe on frozen CLS features, as DINO reports it next to kNN: multinomial logistic
//! regression, fitted full-batch in f64 with L-BFGS (the solver scikit-learn's
//! `LogisticRegression` uses by default), so the optimum is the same convex problem's:
//! mean cross-entropy + λ/2·‖W‖² with an unpenalised bias (scikit-learn's `C` = 1/(λ·n)).
//! λ is chosen on a seeded validation split of the training features and the winner is refit
//! on all of them.
use scdino_base::rng::SplitMix64;
use tch::{Device, Kind, Tensor};

/// A fitted probe: `logits = x · Wᵀ + b`.
#[derive(Debug)]
pub struct LinearProbe {
    /// `[classes, dim]`, f64.
    pub weight: Tensor,
    /// `[classes]`, f64.
    pub bias: Tensor,
    pub l2: f64,
    /// The objective at the solution, and the L-BFGS iterations taken.
    pub objective: f64,
    pub iterations: usize,
}

impl LinearProbe {
    /// Class scores (logits) for `x` `[n, dim]`.
    pub fn logits(&self, x: &Tensor) -> Tensor {
        x.to_kind(Kind::Double).matmul(&self.weight.tr()) + &self.bias
    }
}

/// Objective and gradient of the flat parameters `w` = [W (row-major), b].
fn objective_and_grad(
    w: &Tensor,
    x: &Tensor,
    onehot: &Tensor,
    classes: i64,
    l2: f64,
) -> (f64, Tensor) {
    let (n, dim) = (x.size()[0], x.size()[1]);
    let weight = w.narrow(0, 0, classes * dim).view([classes, dim]);
    let bias = w.narrow(0, classes * dim, classes);
    let logits = x.matmul(&weight.tr()) + &bias;
    let log_p = logits.log_softmax(1, Kind::Double);
    let ce = -(onehot * &log_p).sum(Kind::Double) / n as f64;
    let f = ce.double_value(&[]) + 0.5 * l2 * weight.square().sum(Kind::Double).double_value(&[]);
    let residual = (log_p.exp() - onehot) / n as f64;
    let grad_w = residual.tr().matmul(x) + &weight * l2;
    let grad_b = residual.sum_dim_intlist(0, false, Kind::Double);
    (f, Tensor::cat(&[grad_w.flatten(0, -1), grad_b], 0))
}

/// Fits the probe on `x` `[n, dim]` with labels `y` (codes below `classes`) by L-BFGS (memory
/// 10, Armijo backtracking), until the objective changes by less than 1e-10 relative or the
/// gradient's largest entry is below 1e-8, or `max_iterations`.
pub fn fit(x: &Tensor, y: &[i64], classes: usize, l2: f64, max_iterations: usize) -> LinearProbe {
    let device = x.device();
    let x = x.to_kind(Kind::Double);
    let (n, dim) = (x.size()[0], x.size()[1]);
    assert_eq!(n as usize, y.len(), "one label per feature row");
    let c = classes as i64;
    let onehot = Tensor::from_slice(y)
        .to_device(device)
        .one_hot(c)
        .to_kind(Kind::Double);
    let mut w = Tensor::zeros([c * dim + c], (Kind::Double, device));
    let (mut f, mut g) = objective_and_grad(&w, &x, &onehot, c, l2);
    let mut memory: Vec<(Tensor, Tensor, f64)> = Vec::new(); // (s, y, 1/(y·s))
    let mut iterations = 0;
    while iterations < max_iterations {
        if g.abs().max().double_value(&[]) < 1e-8 {
            break;
        }
        // Two-loop recursion: d = -H·g.
        let mut q = g.shallow_clone() * 1.0;
        let mut alphas = Vec::with_capacity(memory.len());
        for (s, yv, rho) in memory.iter().rev() {
            let a = rho * s.dot(&q).double_value(&[]);
            q -= yv * a;
            alphas.push(a);
        }
        if let Some((s, yv, _)) = memory.last() {
            let gamma = s.dot(yv).double_value(&[]) / yv.dot(yv).double_value(&[]);
            q *= gamma;
        }
        for ((s, yv, rho), a) in memory.iter().zip(alphas.iter().rev()) {
            let b = rho * yv.dot(&q).double_value(&[]);
            q += s * (a - b);
        }
        let mut d = -q;
        let mut slope = g.dot(&d).double_value(&[]);
        if slope >= 0.0 {
            memory.clear();
            d = -&g;
            slope = g.dot(&d).double_value(&[]);
        }
        let mut step = if memory.is_empty() {
            (1.0 / g.abs().sum(Kind::Double).double_value(&[])).min(1.0)
        } else {
            1.0
        };
        let (mut w_new, mut f_new, mut g_new);
        loop {
            w_new = &w + &d * step;
            (f_new, g_new) = objective_and_grad(&w_new, &x, &onehot, c, l2);
            if f_new <= f + 1e-4 * step * slope || step < 1e-20 {
                break;
            }
            step *= 0.5;
        }
        iterations += 1;
        let s = &w_new - &w;
        let yv = &g_new - &g;
        let sy = s.dot(&yv).double_value(&[]);
        let converged = (f - f_new).abs() <= 1e-10 * f.abs().max(f_new.abs()).max(1.0);
        w = w_new;
        g = g_new;
        f = f_new;
        if sy > 1e-12 {
            memory.push((s, yv, 1.0 / sy));
            if memory.len() > 10 {
                let _ = memory.remove(0);
            }
        }
        if converged {
            break;
        }
    }
    LinearProbe {
        weight: w.narrow(0, 0, c * dim).view([c, dim]),
        bias: w.narrow(0, c * dim, c),
        l2,
        objective: f,
        iterations,
    }
}

/// Validation top-1 of one λ.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct L2Trial {
    pub l2: f64,
    pub validation_top1_percent: f64,
}

/// The probe refit on all rows with the λ that scored best on a seeded validation split
/// (ties go to the stronger penalty), and every λ's validation score.
pub fn select_and_fit(
    x: &Tensor,
    y: &[i64],
    classes: usize,
    l2_grid: &[f64],
    validation_fraction: f64,
    max_iterations: usize,
    seed: u64,
) -> (LinearProbe, Vec<L2Trial>) {
    let n = y.len();
    let mut order: Vec<usize> = (0..n).collect();
    let mut rng = SplitMix64::new(seed ^ 0x0001_1ea4_9b0e);
    for i in (1..n).rev() {
        let j = (rng.next_u64() % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
    let n_val = ((n as f64) * validation_fraction).round() as usize;
    let trials = if n_val == 0 || n_val >= n || l2_grid.len() == 1 {
        l2_grid
            .iter()
            .map(|&l2| L2Trial {
                l2,
                validation_top1_percent: f64::NAN,
            })
            .collect::<Vec<_>>()
    } else {
        let (val, train) = order.split_at(n_val);
        let pick = |rows: &[usize]| {
            let idx = Tensor::from_slice(&rows.iter().map(|&r| r as i64).collect::<Vec<_>>())
                .to_device(x.device());
            let labels: Vec<i64> = rows.iter().map(|&r| y[r]).collect();
            (x.index_select(0, &idx), labels)
        };
        let (x_train, y_train) = pick(train);
        let (x_val, y_val) = pick(val);
        l2_grid
            .iter()
            .map(|&l2| {
                let probe = fit(&x_train, &y_train, classes, l2, max_iterations);
                let predicted = Vec::<i64>::try_from(
                    probe.logits(&x_val).argmax(1, false).to_device(Device::Cpu),
                )
                .expect("argmax gives i64");
                let correct = predicted.iter().zip(&y_val).filter(|(a, b)| a == b).count();
                L2Trial {
                    l2,
                    validation_top1_percent: correct as f64 * 100.0 / y_val.len() as f64,
                }
            })
            .collect()
    };
    let best = trials
        .iter()
        .fold(None::<&L2Trial>, |best, t| match best {
            Some(b)
                if b.validation_top1_percent > t.validation_top1_percent
                    || (b.validation_top1_percent == t.validation_top1_percent && b.l2 >= t.l2) =>
            {
                Some(b)
            }
            Some(b) if t.validation_top1_percent.is_nan() => Some(b),
            _ => Some(t),
        })
        .expect("the L2 grid is not empty");
    let probe = fit(x, y, classes, best.l2, max_iterations);
    (probe, trials)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gradient_matches_finite_differences() {
        let x = Tensor::from_slice(&[0.3, -0.2, 0.9, 0.1, -0.5, 0.4, 0.7, 0.7f64]).view([4, 2]);
        let onehot = Tensor::from_slice(&[0i64, 1, 2, 1])
            .one_hot(3)
            .to_kind(Kind::Double);
        let w = Tensor::from_slice(&[0.1, -0.3, 0.2, 0.5, -0.1, 0.05, 0.01, -0.02, 0.03f64]);
        let (_, g) = objective_and_grad(&w, &x, &onehot, 3, 0.7);
        for i in 0..9 {
            let e = Tensor::zeros([9], (Kind::Double, Device::Cpu));
            let _ = e.get(i).fill_(1e-6);
            let (fp, _) = objective_and_grad(&(&w + &e), &x, &onehot, 3, 0.7);
            let (fm, _) = objective_and_grad(&(&w - &e), &x, &onehot, 3, 0.7);
            let numeric = (fp - fm) / 2e-6;
            let analytic = g.double_value(&[i]);
            assert!(
                (numeric - analytic).abs() < 1e-7,
                "{i}: {numeric} vs {analytic}"
            );
        }
    }

    #[test]
    fn separable_classes_are_learned_and_the_penalty_shrinks_weights() {
        let x = Tensor::from_slice(&[1.0, 0.0, 0.9, 0.1, 0.0, 1.0, 0.1, 0.9f64]).view([4, 2]);
        let y = [0i64, 0, 1, 1];
        let weak = fit(&x, &y, 2, 1e-3, 200);
        let strong = fit(&x, &y, 2, 1.0, 200);
        let pred = Vec::<i64>::try_from(weak.logits(&x).argmax(1, false)).unwrap();
        assert_eq!(pred, y);
        let norm = |p: &LinearProbe| p.weight.norm().double_value(&[]);
        assert!(norm(&strong) < norm(&weak));
    }
}
