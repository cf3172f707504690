//! What the golden and run-through tests of rendered scripts share: the shipped example
//! cluster, the preamble and srun options it gives every multi-task job, `bash -n`, and
//! stand-ins for `srun` and `scontrol` that let a real bash run a script.
use crate::cluster::Cluster;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// `slurm/cluster.example.yaml`.
pub(crate) fn example_cluster() -> Cluster {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../slurm/cluster.example.yaml");
    Cluster::load(&p).unwrap()
}

/// A multi-task job script of the example cluster up to its srun command: the header (then
/// `header_extra`), the directives of job `name` (then `directives_extra`), tunables, secrets
/// by name, rendezvous, CPU binding and the container's environment.
pub(crate) fn example_preamble(
    name: &str,
    stage: &str,
    header_extra: &str,
    directives_extra: &str,
) -> String {
    format!(
        r#"#!/bin/bash
# scDINO pipeline job `{name}` (stage {stage}), rendered by launcher 0.1.0.
# Re-render rather than edit. Every value is shell-quoted; no secret is written here.
{header_extra}#SBATCH --job-name=scdino-{name}
#SBATCH --partition=gpu
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=4
#SBATCH --gpus-per-node=4
#SBATCH --cpus-per-task=8
#SBATCH --mem=0
#SBATCH --time=24:00:00
#SBATCH --output=/fsx/scdino/logs/{name}-%j.out
#SBATCH --open-mode=append
#SBATCH --export=ALL
#SBATCH --kill-on-invalid-dep=yes
{directives_extra}set -euo pipefail

# Tunables (with Pyxis also listed in --container-env, so they beat the image's ENV).
export FI_EFA_USE_HUGE_PAGE=0
export FI_PROVIDER=efa
export NCCL_DEBUG=WARN
export NCCL_SOCKET_IFNAME='^docker,lo,veth'
# Secrets, by name only: inherited from the environment `launcher submit` ran in: AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY AWS_SESSION_TOKEN

# Rendezvous: the first node of the allocation, a port derived from the job id.
MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)
MASTER_PORT=$((SLURM_JOB_ID % 4536 + 61000))
export MASTER_ADDR MASTER_PORT
echo "[launcher] {name} job $SLURM_JOB_ID restart ${{SLURM_RESTART_COUNT:-0}} on $SLURM_JOB_NODELIST, master $MASTER_ADDR:$MASTER_PORT"

# Ranks use many threads each: no CPU binding, where the cluster binds at all
# (with TaskPlugin=task/none srun would only warn that it cannot).
cpu_bind=()
case "$(scontrol show config 2>/dev/null | sed -n 's/^TaskPlugin *= *//p')" in
  *affinity* | *cgroup*) cpu_bind=(--cpu-bind=none) ;;
esac
# Variables the container takes from the job, not from the image's ENV: the ones
# above and every network tunable set in the job's environment.
container_env=FI_EFA_USE_HUGE_PAGE,FI_PROVIDER,NCCL_DEBUG,NCCL_SOCKET_IFNAME,AWS_ACCESS_KEY_ID,AWS_SECRET_ACCESS_KEY,AWS_SESSION_TOKEN,MASTER_ADDR,MASTER_PORT
for name in $(compgen -e); do
  case $name in NCCL_* | FI_* | OFI_* | GLOO_* | UCX_* | TORCH_NCCL_*) ;; *) continue ;; esac
  case ",$container_env," in *",$name,"*) ;; *) container_env="${{container_env:+$container_env,}}$name" ;; esac
done
container_env_opt=()
if [ -n "$container_env" ]; then container_env_opt=("--container-env=$container_env"); fi

"#
    )
}

/// The srun command of a multi-task job of the example cluster up to the trainer.
pub(crate) const EXAMPLE_SRUN: &str = r#"srun \
  --kill-on-bad-exit=1 \
  "${cpu_bind[@]}" \
  '--container-image=123456789012.dkr.ecr.us-east-1.amazonaws.com#scdino:0.1.0' \
  --container-mounts=/fsx:/fsx,/opt/dlami/nvme:/scratch \
  --container-workdir=/fsx/scdino \
  --no-container-mount-home \
  "${container_env_opt[@]}" \
  /opt/scdino/bin/trainer "#;

/// `bash -n` accepts the script.
pub(crate) fn bash_n(text: &str) {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("s.sbatch");
    std::fs::write(&f, text).unwrap();
    let out = Command::new("bash").arg("-n").arg(&f).output().unwrap();
    assert!(
        out.status.success(),
        "bash -n: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Stand-ins in `<dir>/bin`: `srun` records its arguments (NUL-separated) and then runs
/// `srun_extra` (shell lines); `scontrol show config` reports `task_plugin`, and `scontrol show
/// hostnames` prints `nodes`, one per line.
pub(crate) struct StandIns {
    dir: PathBuf,
    bin: PathBuf,
    args: PathBuf,
}

impl StandIns {
    pub(crate) fn new(dir: &Path, srun_extra: &str, task_plugin: &str, nodes: &[&str]) -> Self {
        let bin = dir.join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        let args = dir.join("srun.args");
        let srun = format!(
            "#!/bin/bash\nprintf '%s\\0' \"$@\" > {}\n{srun_extra}",
            crate::shell::quote(args.to_str().unwrap())
        );
        let scontrol = format!(
            "#!/bin/bash\nif [ \"$2\" = config ]; then echo 'TaskPlugin              = {task_plugin}'; else printf '%s\\n' {}; fi\n",
            crate::shell::join(nodes)
        );
        for (name, body) in [("srun", srun), ("scontrol", scontrol)] {
            let p = bin.join(name);
            std::fs::write(&p, body).unwrap();
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        StandIns {
            dir: dir.to_path_buf(),
            bin,
            args,
        }
    }

    /// Runs `script` with bash, the stand-ins first on PATH, and `env` set.
    pub(crate) fn run(&self, script: &str, env: &[(&str, &str)]) -> Output {
        let f = self.dir.join("job.sbatch");
        std::fs::write(&f, script).unwrap();
        let path = format!("{}:{}", self.bin.display(), std::env::var("PATH").unwrap());
        let mut c = Command::new("bash");
        c.arg(&f).env("PATH", path);
        for (k, v) in env {
            c.env(k, v);
        }
        c.output().unwrap()
    }

    /// The words srun received in its last run.
    pub(crate) fn srun_args(&self) -> Vec<String> {
        std::fs::read(&self.args)
            .unwrap()
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8(a.to_vec()).unwrap())
            .collect()
    }
}
