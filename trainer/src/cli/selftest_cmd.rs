//! `trainer selftest`: the checks of [`trainer::selftest`] for this task, as a table (and a
//! JSON line for `launcher selftest`); exit 1 when one fails.
use anyhow::Result;
use clap::Args;
use std::time::Duration;
use trainer::distributed::env::DistEnv;
use trainer::selftest::{self, Options};

#[derive(Debug, Args)]
pub struct SelftestArgs {
    /// Also print the report as JSON after the table, in `@scdino-report` lines of under
    /// 512 bytes (`scdino_base::report`), which survive the output of several tasks being
    /// interleaved in one job log.
    #[arg(long)]
    json: bool,
    /// Seconds the all-reduce's rendezvous and collective may take.
    #[arg(long, default_value_t = 300)]
    timeout: u64,
}

impl SelftestArgs {
    pub fn run(self) -> Result<()> {
        let env = DistEnv::from_process_env()?;
        let report = selftest::run(
            &env,
            &Options {
                timeout: Duration::from_secs(self.timeout),
            },
        );
        print!("{}", report.table());
        if self.json {
            let json = serde_json::to_string(&report)?;
            for line in scdino_base::report::encode(selftest::REPORT_KIND, report.rank, &json) {
                println!("{line}");
            }
        }
        if !report.passed {
            std::process::exit(1);
        }
        Ok(())
    }
}
