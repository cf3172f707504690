"""DINOv2's Sinkhorn-Knopp teacher centring, as dinov2/loss/dino_clstoken_loss.py defines it
(`DINOLoss.sinkhorn_knopp_teacher`), on one process (no process group): the oracle for
`trainer::train::loss::sinkhorn_knopp`."""
import torch


@torch.no_grad()
def sinkhorn_knopp_teacher(teacher_output, teacher_temp, n_iterations=3, world_size=1):
    teacher_output = teacher_output.float()
    Q = torch.exp(teacher_output / teacher_temp).t()  # Q is K-by-B for consistency with notations from our paper
    B = Q.shape[1] * world_size  # number of samples to assign
    K = Q.shape[0]  # how many prototypes
    # make the matrix sums to 1
    sum_Q = torch.sum(Q)
    Q /= sum_Q
    for it in range(n_iterations):
        # normalize each row: total weight per prototype must be 1/K
        sum_of_rows = torch.sum(Q, dim=1, keepdim=True)
        Q /= sum_of_rows
        Q /= K
        # normalize each column: total weight per sample must be 1/B
        Q /= torch.sum(Q, dim=0, keepdim=True)
        Q /= B
    Q *= B  # the colomns must sum to 1 so that Q is an assignment
    return Q.t()
