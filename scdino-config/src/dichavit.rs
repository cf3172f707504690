//! `model.dichavit`: DiChaViT's additions to ChannelViT (Pham & Plummer, NeurIPS 2024;
//! chaudatascience/diverse_channel_vit `models/dichavit.py`, `models/loss_fn.py`). Its own
//! file so the schema of the other sections stays as it is; `reference.rs` reads it too.
use serde::{Deserialize, Serialize};

/// DiChaViT's channel and token diversification losses and its diverse channel sampling, for
/// `model.channels: tokens` only. Each piece is off by default (a run without this block
/// trains and checkpoints as before); the other values are the published CHAMMI recipe
/// (`train_scripts.sh`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DiChaViTSection {
    /// Channel Diversification Loss weight (`proxy_loss_lambda`; CHAMMI 0.1, JUMP-CP 0.001; 0 =
    /// off): each channel gets a learnable proxy (`patch_embed.channel_emb_proxies`), and the
    /// step's channel embeddings are classified to their own proxy by cross-entropy over
    /// −‖s·ĉ_i − s·p̂_j‖² (L2-normalised), which keeps the channel embeddings apart.
    pub channel_loss_weight: f64,
    /// The channel loss's temperature τ (`model.temperature`, 0.07 in every published script):
    /// s = √(1/τ).
    pub channel_loss_temperature: f64,
    /// Token Diversification Loss weight (`ortho_loss_v1_lambda`; CHAMMI 1, JUMP-CP 0.001; 0 =
    /// off): on the student's global crops, the L2-normalised patch tokens before the channel
    /// embedding is added; P is the mean cosine of same-channel pairs, N of cross-channel
    /// pairs, the loss γ_s·P + γ_d·N (γ_s·(1 − P) + γ_d·N without `reverse_pos_pairs`).
    pub token_loss_weight: f64,
    /// γ_s (`gamma_s`; CHAMMI 0.5, JUMP-CP 1): the weight of the same-channel term.
    pub gamma_s: f64,
    /// γ_d (`gamma_d`; CHAMMI 2, JUMP-CP 4): the weight of the cross-channel term.
    pub gamma_d: f64,
    /// `reverse_pos_pairs` (true in every published script): same-channel tokens are pushed
    /// apart too (γ_s·P) instead of together (γ_s·(1 − P)).
    pub reverse_pos_pairs: bool,
    /// How a step's channels are drawn: `hierarchical` (ChannelViT) or `diverse` (DiChaViT).
    pub sampling: ChannelSampling,
    /// Diverse sampling's temperature t (`hcs_sampling_temp`; CHAMMI 0.1, JUMP-CP 1000): low
    /// favours the channels least like the anchor, high is nearly uniform.
    pub sampling_temperature: f64,
}

impl Default for DiChaViTSection {
    fn default() -> Self {
        Self {
            channel_loss_weight: 0.0,
            channel_loss_temperature: 0.07,
            token_loss_weight: 0.0,
            gamma_s: 0.5,
            gamma_d: 2.0,
            reverse_pos_pairs: true,
            sampling: ChannelSampling::Hierarchical,
            sampling_temperature: 0.1,
        }
    }
}

/// `model.dichavit.sampling`: the channel subset of each training step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChannelSampling {
    /// ChannelViT's hierarchical channel sampling: k uniform on 1..C, then k channels
    /// uniformly.
    #[default]
    Hierarchical,
    /// DiChaViT's diverse channel sampling (`lowest_cosine_prob`): k uniform on 1..C, a
    /// uniform anchor channel, then k channels drawn without replacement with probabilities
    /// softmax((1 − cos(e_anchor, e_j))/t) over the student's channel embeddings, the anchor
    /// forced in.
    Diverse,
}

#[cfg(test)]
mod tests {
    use crate::{ChannelSampling, Config, ConfigError};

    const TOKENS: &str = "data:\n  channel_names: [a, b, c]\n  channel_combinations: [\"012\"]\nmodel:\n  channels: tokens\n";

    fn refused(yaml: &str) -> (String, String) {
        match Config::from_yaml(yaml, "t.yaml") {
            Err(ConfigError::Invalid { key, message, .. }) => (key, message),
            other => panic!("expected a validation error, got {other:?}"),
        }
    }

    #[test]
    fn dichavit_keys_need_tokens_and_are_strict() {
        let on = "  dichavit:\n    channel_loss_weight: 0.1\n    token_loss_weight: 1\n    sampling: diverse\n";
        let c = Config::from_yaml(&format!("{TOKENS}{on}"), "t").unwrap();
        let d = &c.model.dichavit;
        assert_eq!(
            (d.channel_loss_weight, d.token_loss_weight, d.sampling),
            (0.1, 1.0, ChannelSampling::Diverse)
        );
        assert_eq!(
            (d.gamma_s, d.gamma_d, d.reverse_pos_pairs),
            (0.5, 2.0, true)
        );
        assert_eq!(Config::from_yaml(&c.to_yaml(), "shown").unwrap(), c);
        for mode in ["fixed", "bag"] {
            let text = TOKENS.replace("tokens", mode);
            let (key, msg) = refused(&format!("{text}  dichavit:\n    gamma_d: 4\n"));
            assert_eq!(key, "model.dichavit");
            assert!(
                msg.contains("model.channels: tokens") && msg.contains(mode),
                "{msg}"
            );
            // The defaults written out (as `config show` does) are accepted.
            let shown = Config::from_yaml(&text, "t").unwrap().to_yaml();
            assert!(Config::from_yaml(&shown, "shown").is_ok());
        }
        let (key, _) = refused(&format!(
            "{TOKENS}  dichavit:\n    sampling_temperature: 0\n"
        ));
        assert_eq!(key, "model.dichavit.sampling_temperature");
        let (key, msg) = refused(&format!(
            "{TOKENS}  dichavit:\n    sampling: diverse\ntrain:\n  strategy: fsdp\n"
        ));
        assert_eq!(key, "model.dichavit.sampling", "{msg}");
        let e = Config::from_yaml(&format!("{TOKENS}  dichavit:\n    proxy_loss: 1\n"), "t")
            .unwrap_err()
            .to_string();
        assert!(e.contains("proxy_loss"), "{e}");
    }
}
