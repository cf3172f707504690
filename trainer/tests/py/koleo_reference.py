"""DINOv2's KoLeo loss, as dinov2/loss/koleo_loss.py defines it (facebookresearch/dinov2): the
oracle for trainer/src/train/koleo.rs. `per_row` gives the per-row terms, for the rows our
loss keeps (a nearest neighbour that is the same vector is left out there)."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class KoLeoLoss(nn.Module):
    """Kozachenko-Leonenko entropic loss regularizer from Sablayrolles et al. - 2018 -
    Spreading vectors for similarity search"""

    def __init__(self):
        super().__init__()
        self.pdist = nn.PairwiseDistance(2, eps=1e-8)

    def pairwise_NNs_inner(self, x):
        """Pairwise nearest neighbors for L2-normalized vectors."""
        dots = torch.mm(x, x.t())
        n = x.shape[0]
        dots.view(-1)[:: (n + 1)].fill_(-1)  # Trick to fill diagonal with -1
        _, I = torch.max(dots, dim=1)  # noqa: E741
        return I

    def per_row(self, student_output, eps=1e-8):
        student_output = F.normalize(student_output, eps=eps, p=2, dim=-1)
        I = self.pairwise_NNs_inner(student_output)  # noqa: E741
        distances = self.pdist(student_output, student_output[I])  # BxD, BxD -> B
        return -torch.log(distances + eps), distances

    def forward(self, student_output, eps=1e-8):
        with torch.autocast("cpu", enabled=False):
            terms, _ = self.per_row(student_output.float(), eps)
            return terms.mean()
