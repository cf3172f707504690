"""DINOv2's iBOT patch loss, as dinov2/loss/ibot_patch_loss.py defines it
(facebookresearch/dinov2, the non-xformers `lossfunc`), on one process: the oracle for
trainer/src/train/ibot.rs. The masked rows are gathered as dinov2's ssl_meta_arch does
(`mask_indices_list`, row-major over the flattened [B, N] masks)."""
import torch
import torch.nn.functional as F


def lossfunc(t, s, temp):
    return torch.sum(t * F.log_softmax(s / temp, dim=-1), dim=-1)


class iBOTPatchLoss(torch.nn.Module):
    def __init__(self, patch_out_dim, student_temp=0.1, center_momentum=0.9):
        super().__init__()
        self.student_temp = student_temp
        self.center_momentum = center_momentum
        self.register_buffer("center", torch.zeros(1, 1, patch_out_dim))

    @torch.no_grad()
    def softmax_center_teacher(self, teacher_patch_tokens, teacher_temp):
        return F.softmax((teacher_patch_tokens - self.center) / teacher_temp, dim=-1)

    @torch.no_grad()
    def sinkhorn_knopp_teacher(self, teacher_output, teacher_temp, n_masked_patches, n_iterations=3):
        teacher_output = teacher_output.float()
        Q = torch.exp(teacher_output / teacher_temp).t()
        B = n_masked_patches
        K = Q.shape[0]
        Q /= torch.sum(Q)
        for _ in range(n_iterations):
            Q /= torch.sum(Q, dim=1, keepdim=True)
            Q /= K
            Q /= torch.sum(Q, dim=0, keepdim=True)
            Q /= B
        Q *= B
        return Q.t()

    def forward_masked(self, student_patch_tokens_masked, teacher_patch_tokens_masked, student_masks_flat):
        t = teacher_patch_tokens_masked
        s = student_patch_tokens_masked
        loss = lossfunc(t, s, self.student_temp)
        masks_weight = (
            (1 / student_masks_flat.sum(-1).clamp(min=1.0))
            .unsqueeze(-1)
            .expand_as(student_masks_flat)[student_masks_flat]
        )
        loss = loss * masks_weight
        return -loss.sum() / student_masks_flat.shape[0]

    @torch.no_grad()
    def update_center(self, teacher_patch_tokens):
        # reduce_center_update + apply_center_update, world size 1
        batch_center = torch.sum(teacher_patch_tokens.mean(1), dim=0, keepdim=True)
        _t = batch_center / len(teacher_patch_tokens)
        self.center = self.center * self.center_momentum + _t * (1 - self.center_momentum)
