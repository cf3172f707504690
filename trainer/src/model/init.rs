//! Initialisers matching PyTorch/DINO where tch has no exact counterpart.
use tch::{nn, Tensor};

/// DINO's `trunc_normal_(std, a=-2, b=2)`. The bounds are absolute, i.e. 100σ for std 0.02,
/// so this is a normal draw whose clamp never fires in practice; kept for exactness.
pub(crate) fn trunc_normal_(t: &Tensor, std: f64) {
    tch::no_grad(|| {
        let mut t = t.shallow_clone();
        let _ = t.normal_(0.0, std);
        let _ = t.clamp_(-2.0, 2.0);
    });
}

/// PyTorch's default Linear/Conv init, `kaiming_uniform_(a=√5)`, reduces to U(±1/√fan_in)
/// for weights, and its bias init is the same bound.
pub(crate) fn pytorch_default_uniform(fan_in: i64) -> nn::Init {
    let bound = 1.0 / (fan_in as f64).sqrt();
    nn::Init::Uniform {
        lo: -bound,
        up: bound,
    }
}

/// A `[rows, dim]` matrix (rows ≤ dim) with orthonormal rows scaled to `row_norm`:
/// DiChaViT's orthogonal channel embeddings, at the size a trunc-normal(0.02) row has on
/// average (0.02·√dim), so they start as large as ChannelViT's. The QR of a Gaussian with
/// R's diagonal signs folded in, as PyTorch's `orthogonal_` does.
pub(crate) fn orthogonal_rows(rows: i64, dim: i64, row_norm: f64, device: tch::Device) -> Tensor {
    tch::no_grad(|| {
        let g = Tensor::randn([dim, rows], (tch::Kind::Float, device));
        let (q, r) = Tensor::linalg_qr(&g, "reduced");
        let signs = r.diagonal(0, 0, 1).sign();
        (q * signs.unsqueeze(0)).transpose(0, 1) * row_norm
    })
}
