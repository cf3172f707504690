//! pycytominer 1.7's `normalize`: `standardize` (scikit-learn's StandardScaler),
//! `robustize` (RobustScaler: median and interquartile range), `mad_robustize` (median and
//! 1.4826 × the median absolute deviation, plus `mad_robustize_epsilon`) and `spherize`
//! (`ZCA-cor` by default; `ZCA`, `PCA`, `PCA-cor`), each fitted on all rows or on the control
//! rows (`samples=` in pycytominer) and applied to every row, globally or per group of rows
//! (per plate, per batch: pycytominer is called once per group for that). Computed in
//! float64, written as float32 profile columns.
use tch::{Device, Kind, Tensor};

use super::keys::{groups, Codes};
use super::{ProfileTable, ScoringError};

/// A normalisation method.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum Method {
    Standardize,
    Robustize,
    MadRobustize,
    Spherize,
}

/// pycytominer's `spherize_method`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
pub enum SpherizeMethod {
    #[value(name = "ZCA-cor")]
    #[serde(rename = "ZCA-cor")]
    ZcaCor,
    #[value(name = "ZCA")]
    #[serde(rename = "ZCA")]
    Zca,
    #[value(name = "PCA-cor")]
    #[serde(rename = "PCA-cor")]
    PcaCor,
    #[value(name = "PCA")]
    #[serde(rename = "PCA")]
    Pca,
}

/// What to fit on and how.
#[derive(Debug, Clone)]
pub struct NormalizeOptions {
    pub method: Method,
    /// `(column, value)`: fit on the rows where `column == value` only.
    pub controls: Option<(String, String)>,
    /// Fit and apply separately within each group of these columns.
    pub by: Vec<String>,
    pub spherize_method: SpherizeMethod,
    pub spherize_epsilon: f64,
    pub mad_epsilon: f64,
}

/// The normalised table: same rows and metadata, new features (renamed `PC1…` by PCA).
pub fn normalize(
    table: &ProfileTable,
    opts: &NormalizeOptions,
) -> Result<ProfileTable, ScoringError> {
    table.need_rows(2, "normalize (a fit of centre and scale)")?;
    table.check_finite()?;
    let is_control: Vec<bool> = match &opts.controls {
        None => vec![true; table.rows],
        Some((col, value)) => table
            .column(col)?
            .iter()
            .map(|v| v.as_deref() == Some(value.as_str()))
            .collect(),
    };
    let d = table.dim();
    let mut out = vec![0f32; table.rows * d];
    for rows in groups(&Codes::of(table, &opts.by)?, table.rows) {
        let fit: Vec<usize> = rows.iter().copied().filter(|&r| is_control[r]).collect();
        let group = describe(table, &opts.by, rows[0]);
        if fit.is_empty() {
            return Err(ScoringError::invalid(
                table,
                format!(
                    "{group}has no control rows to fit on ({})",
                    opts.controls
                        .as_ref()
                        .map(|(c, v)| format!("{c}={v}"))
                        .unwrap_or_default()
                ),
            ));
        }
        if fit.len() < 2 {
            return Err(ScoringError::invalid(
                table,
                format!(
                    "{group}has {} row to fit on{}: a centre and a scale need at least two",
                    fit.len(),
                    if opts.controls.is_some() {
                        " (control)"
                    } else {
                        ""
                    }
                ),
            ));
        }
        let x = |rows: &[usize]| {
            let mut v = Vec::with_capacity(rows.len() * d);
            for &r in rows {
                v.extend(table.row(r).iter().map(|&x| f64::from(x)));
            }
            Tensor::from_slice(&v).reshape([rows.len() as i64, d as i64])
        };
        if opts.method == Method::Spherize && fit.len() <= d {
            tracing::warn!(
                "{}: {group}spherize is fitted on {} rows for {d} features: centred, they span \
                 at most {} directions, and the other {} are scaled by the last singular value \
                 (fit on more rows, or select features first)",
                table.path.display(),
                fit.len(),
                fit.len() - 1,
                d + 1 - fit.len()
            );
        }
        let fitted = Fitted::fit(&x(&fit), opts)
            .map_err(|what| ScoringError::invalid(table, format!("{group}{what}")))?;
        let y = fitted.apply(&x(&rows)).to_kind(Kind::Float);
        let y = Vec::<f32>::try_from(&y.flatten(0, -1)).expect("float features");
        for (i, &r) in rows.iter().enumerate() {
            out[r * d..(r + 1) * d].copy_from_slice(&y[i * d..(i + 1) * d]);
        }
    }
    let pca = opts.method == Method::Spherize
        && matches!(
            opts.spherize_method,
            SpherizeMethod::Pca | SpherizeMethod::PcaCor
        );
    Ok(ProfileTable {
        path: table.path.clone(),
        meta: table.meta.clone(),
        feature_names: if pca {
            (1..=d).map(|i| format!("PC{i}")).collect()
        } else {
            table.feature_names.clone()
        },
        features: out,
        rows: table.rows,
        nested: table.nested.clone(),
    })
}

fn describe(table: &ProfileTable, by: &[String], row: usize) -> String {
    if by.is_empty() {
        return "the table ".into();
    }
    let parts: Vec<String> = by
        .iter()
        .map(|c| {
            format!(
                "{c}={}",
                table
                    .column(c)
                    .ok()
                    .and_then(|v| v[row].clone())
                    .unwrap_or_default()
            )
        })
        .collect();
    format!("group {}: ", parts.join(","))
}

/// A fitted transform: `(x - center) / scale`, then `@ w` for spherize.
struct Fitted {
    center: Tensor,
    scale: Tensor,
    w: Option<Tensor>,
}

impl Fitted {
    fn fit(x: &Tensor, opts: &NormalizeOptions) -> Result<Self, String> {
        let n = x.size()[0];
        let ones = |t: &Tensor| t.ones_like();
        match opts.method {
            Method::Standardize => {
                let (center, scale) = standard(x);
                Ok(Self {
                    center,
                    scale,
                    w: None,
                })
            }
            Method::Robustize => {
                let center = quantile(x, 0.5);
                let scale = quantile(x, 0.75) - quantile(x, 0.25);
                let tiny = scale.lt(10.0 * f64::EPSILON);
                let scale = scale.where_self(&tiny.logical_not(), &ones(&center));
                Ok(Self {
                    center,
                    scale,
                    w: None,
                })
            }
            Method::MadRobustize => {
                let center = quantile(x, 0.5);
                let mad = quantile(&(x - &center).abs(), 0.5) * 1.4826;
                Ok(Self {
                    center,
                    scale: mad + opts.mad_epsilon,
                    w: None,
                })
            }
            Method::Spherize => {
                let cor = matches!(
                    opts.spherize_method,
                    SpherizeMethod::ZcaCor | SpherizeMethod::PcaCor
                );
                let (center, scale) = if cor {
                    let mean = x.mean_dim(Some(&[0i64][..]), false, Kind::Double);
                    let var = (x - &mean)
                        .square()
                        .mean_dim(Some(&[0i64][..]), false, Kind::Double);
                    if bool::try_from(var.eq(0.0).any()).unwrap_or(false) {
                        return Err("spherize: a feature has zero variance (remove low-variance features first)".into());
                    }
                    standard(x)
                } else {
                    (
                        x.mean_dim(Some(&[0i64][..]), false, Kind::Double),
                        ones(&x.select(0, 0)),
                    )
                };
                let z = (x - &center) / &scale;
                let w = sphere(&z, n, opts)?;
                Ok(Self {
                    center,
                    scale,
                    w: Some(w),
                })
            }
        }
    }

    fn apply(&self, x: &Tensor) -> Tensor {
        let z = (x - &self.center) / &self.scale;
        match &self.w {
            Some(w) => z.matmul(w),
            None => z,
        }
    }
}

/// StandardScaler's mean and scale (population std; 1 for constant features).
fn standard(x: &Tensor) -> (Tensor, Tensor) {
    let n = x.size()[0] as f64;
    let mean = x.mean_dim(Some(&[0i64][..]), false, Kind::Double);
    let var = (x - &mean)
        .square()
        .mean_dim(Some(&[0i64][..]), false, Kind::Double);
    // scikit-learn's `_is_constant_feature`.
    let bound = &var * (n * f64::EPSILON) + (&mean * (n * f64::EPSILON)).square();
    let constant = var.le_tensor(&bound);
    let scale = var
        .sqrt()
        .where_self(&constant.logical_not(), &mean.ones_like());
    (mean, scale)
}

/// Column quantiles with linear interpolation (numpy's default, pandas' median).
fn quantile(x: &Tensor, q: f64) -> Tensor {
    x.quantile_scalar(q, Some(0), false, "linear")
}

/// The rows of `vt` (the principal directions) with scikit-learn's `svd_flip` sign
/// convention (`u_based_decision=False`): each row's largest-magnitude entry positive (the
/// first such entry on ties). An SVD determines a direction only up to its sign, and
/// pycytominer leaves it to the SVD routine, so PCA outputs would otherwise change sign
/// between machines and libraries; ZCA (`W Vᵀ`) does not depend on it.
fn svd_flip(vt: &Tensor) -> Tensor {
    let top = vt.abs().argmax(1, true);
    let sign = vt.gather(1, &top, false).sign();
    let sign = sign.where_self(&sign.ne(0.0), &sign.ones_like());
    vt * sign
}

/// pycytominer's `Spherize.fit` weights from the centred (and scaled) `z`.
fn sphere(z: &Tensor, n: i64, opts: &NormalizeOptions) -> Result<Tensor, String> {
    let d = z.size()[1];
    // `torch.svd(some=False)` is `linalg_svd(full_matrices=True)` with V for Vh; tch's
    // linalg_svd always passes a `driver`, which CPU tensors refuse.
    let (_, s, v) = z.svd(n > d, true);
    let vt = svd_flip(&v.transpose(0, 1));
    let s_vals = Vec::<f64>::try_from(&s).expect("singular values");
    let tol = s_vals.iter().cloned().fold(0.0, f64::max) * n.max(d) as f64 * f64::EPSILON;
    let r = s_vals.iter().filter(|&&v| v > tol).count() as i64;
    if r != d && r != n - 1 && r == n {
        return Err(format!(
            "the data matrix is not full rank: n = {n}, d = {d}, r = {r}"
        ));
    }
    let mut sigma = s_vals;
    if n <= d {
        if r != n - 1 && r != n {
            return Err(format!(
                "rank {r} with n = {n} <= d = {d}: linear dependencies in the data"
            ));
        }
        let last = sigma[(r - 1).max(0) as usize];
        sigma.truncate(r as usize);
        sigma.resize(d as usize, last);
    }
    let sigma = Tensor::from_slice(&sigma) + opts.spherize_epsilon;
    let w = (&vt / sigma.unsqueeze(1)).transpose(0, 1) * ((n - 1) as f64).sqrt();
    Ok(match opts.spherize_method {
        SpherizeMethod::Zca | SpherizeMethod::ZcaCor => w.matmul(&vt),
        SpherizeMethod::Pca | SpherizeMethod::PcaCor => w,
    }
    .to_device(Device::Cpu))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn svd_flip_makes_each_rows_largest_entry_positive() {
        let vt =
            Tensor::from_slice(&[0.6f64, -0.8, 0.0, 0.8, 0.6, 0.0, 0.0, 0.0, -1.0]).reshape([3, 3]);
        let got = Vec::<f64>::try_from(svd_flip(&vt).flatten(0, -1)).unwrap();
        assert_eq!(got, [-0.6, 0.8, 0.0, 0.8, 0.6, 0.0, 0.0, 0.0, 1.0]);
    }
}
