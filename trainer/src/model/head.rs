//! DINO projection head: MLP → L2 normalisation → weight-normalised prototype layer.
use super::init::pytorch_default_uniform;
use super::units::{module_name, names, Unit, UnitKind};
use super::vit::linear;
use tch::{nn, nn::Module, nn::ModuleT, Tensor};

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HeadConfig {
    pub in_dim: i64,
    pub out_dim: i64,
    pub use_bn: bool,
    /// Keep `last_layer.weight_g` fixed at 1, so prototypes stay on the unit sphere.
    pub norm_last_layer: bool,
    pub nlayers: i64,
    pub hidden_dim: i64,
    pub bottleneck_dim: i64,
}

impl HeadConfig {
    /// DINO's defaults: 3 layers, 2048 hidden, 256 bottleneck.
    pub fn new(in_dim: i64, out_dim: i64, use_bn: bool, norm_last_layer: bool) -> Self {
        Self {
            in_dim,
            out_dim,
            use_bn,
            norm_last_layer,
            nlayers: 3,
            hidden_dim: 2048,
            bottleneck_dim: 256,
        }
    }
}

#[derive(Debug)]
enum MlpLayer {
    /// With its module name (`head.mlp.0`, or `head.mlp` for a lone Linear).
    Linear(nn::Linear, String),
    BatchNorm(nn::BatchNorm, String),
    Gelu,
}

#[derive(Debug)]
pub struct DinoHead {
    mlp: Vec<MlpLayer>,
    weight_g: Tensor,
    weight_v: Tensor,
    name: String,
}

impl DinoHead {
    pub fn new(p: nn::Path, cfg: HeadConfig) -> Self {
        let mlp_path = &p / "mlp";
        let nlayers = cfg.nlayers.max(1);
        let mut mlp = Vec::new();
        if nlayers == 1 {
            // PyTorch stores a lone Linear as `mlp.weight`, not inside a Sequential.
            let name = module_name(&mlp_path);
            mlp.push(MlpLayer::Linear(
                linear(mlp_path, cfg.in_dim, cfg.bottleneck_dim),
                name,
            ));
        } else {
            // Indices follow nn.Sequential numbering: GELU (and BN) occupy slots too.
            let mut idx = 0i64;
            let mut in_dim = cfg.in_dim;
            for _ in 0..nlayers - 1 {
                mlp.push(MlpLayer::Linear(
                    linear(&mlp_path / idx, in_dim, cfg.hidden_dim),
                    module_name(&(&mlp_path / idx)),
                ));
                idx += 1;
                if cfg.use_bn {
                    let bn = nn::batch_norm1d(&mlp_path / idx, cfg.hidden_dim, Default::default());
                    mlp.push(MlpLayer::BatchNorm(bn, module_name(&(&mlp_path / idx))));
                    idx += 1;
                }
                mlp.push(MlpLayer::Gelu);
                idx += 1;
                in_dim = cfg.hidden_dim;
            }
            mlp.push(MlpLayer::Linear(
                linear(&mlp_path / idx, in_dim, cfg.bottleneck_dim),
                module_name(&(&mlp_path / idx)),
            ));
        }
        // `weight_v` keeps nn.Linear's default init: DINO applies its init before creating it.
        let last = &p / "last_layer";
        let weight_v = last.var(
            "weight_v",
            &[cfg.out_dim, cfg.bottleneck_dim],
            pytorch_default_uniform(cfg.bottleneck_dim),
        );
        let weight_g = if cfg.norm_last_layer {
            last.ones_no_train("weight_g", &[cfg.out_dim, 1])
        } else {
            last.var("weight_g", &[cfg.out_dim, 1], nn::Init::Const(1.0))
        };
        Self {
            mlp,
            weight_g,
            weight_v,
            name: module_name(&p),
        }
    }

    /// The head as one unit (its MLP layers, then the last layer's `weight_g` and `weight_v`:
    /// the weight norm reads both), and the last layer's parameters. `weight_g` is declared
    /// also when `norm_last_layer` keeps it fixed, as PyTorch still lists it as a parameter.
    pub fn units(&self) -> (Unit, Vec<String>) {
        let mut params = vec![];
        for layer in &self.mlp {
            match layer {
                MlpLayer::Linear(_, name) | MlpLayer::BatchNorm(_, name) => {
                    params.extend(names(name, &["weight", "bias"]));
                }
                MlpLayer::Gelu => {}
            }
        }
        let last_layer = names(
            &format!("{}.last_layer", self.name),
            &["weight_g", "weight_v"],
        );
        params.extend(last_layer.iter().cloned());
        let unit = Unit {
            kind: UnitKind::Head,
            name: self.name.clone(),
            params,
        };
        (unit, last_layer)
    }

    /// `[B, in_dim]` → `[B, out_dim]` logits (cosine similarity to each prototype × g).
    pub fn forward_t(&self, x: &Tensor, train: bool) -> Tensor {
        let mut h = x.shallow_clone();
        for layer in &self.mlp {
            h = match layer {
                MlpLayer::Linear(l, _) => l.forward(&h),
                MlpLayer::BatchNorm(bn, _) => bn.forward_t(&h, train),
                MlpLayer::Gelu => h.gelu("none"),
            };
        }
        let h = normalize_l2(&h);
        // weight_norm(dim=0): each prototype row of v scaled to norm g, with PyTorch's fused
        // kernel (the unfused g·v/‖v‖ costs three passes over out_dim×256 in both directions).
        let weight = Tensor::internal_weight_norm(&self.weight_v, &self.weight_g, 0);
        h.matmul(&weight.tr())
    }
}

/// `F.normalize(x, p=2, dim=-1)` with its eps of 1e-12.
fn normalize_l2(x: &Tensor) -> Tensor {
    let n = x.norm_scalaropt_dim(2.0, [-1], true).clamp_min(1e-12);
    x / n
}
