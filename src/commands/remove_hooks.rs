//! `remove-hooks`: at uninstall, remove the EC2_INSTANCE_TERMINATING hooks this
//! service created on its groups, so that no instance waits for a hook nobody
//! answers any more. One line per group; exit codes in [`AFTER_HELP`].

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use crate::config::ConfigArgs;
use crate::scalein::remove_hooks::{remove_hooks, RemoveOptions};

pub const AFTER_HELP: &str = "\
Removes, on every group the configuration names or discovers, the lifecycle hook named \
scaleIn.hookName when the group's tag ca-asg-provider.io/lifecycle-hook records that this \
service created it. A hook of that name without the record is kept and printed with the aws \
command that removes it (--include-unmarked removes it too); hooks of other names are never \
touched. AWS continues the instances a deleted hook held. Running it again is harmless.

Exit codes: 0 every hook of ours is removed (or there was none; kept unmarked hooks are \
listed); 1 some group failed, or AWS could not be read, or the timeout passed (each says \
why); 2 the configuration is invalid.";

#[derive(Debug, Args, Clone)]
#[command(after_help = AFTER_HELP)]
pub struct RemoveHooksArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Say what would be removed; remove nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Also remove a hook with the service's name that has no record of being created
    /// by it (an earlier version's, or one made by hand under that name).
    #[arg(long)]
    pub include_unmarked: bool,
    /// Give up after this long, e.g. 2m (the chart's Job has its own deadline above it).
    #[arg(long, default_value = "2m", value_parser = crate::duration::parse_duration)]
    pub timeout: Duration,
}

pub async fn run(args: RemoveHooksArgs) -> ExitCode {
    let mut cfg = match args.config.load() {
        Ok(c) => c,
        Err(e) => {
            println!("configuration: INVALID\n{e}");
            return ExitCode::from(2);
        }
    };
    // A region AWS cannot have is refused before any call, as check-config, serve and
    // drain refuse it.
    match crate::cloud::aws::resolve_known_region(&cfg.aws_settings()).await {
        Ok(r) => cfg.set_region(r),
        Err(e) => {
            println!("region: {e}");
            return ExitCode::from(2);
        }
    }
    if let Err(e) = cfg.require_groups() {
        println!("{e}");
        return ExitCode::from(2);
    }
    let opts = RemoveOptions {
        name: cfg.scale_in.hook_name.clone(),
        include_unmarked: args.include_unmarked,
        dry_run: args.dry_run,
        region: cfg.region.clone(),
    };
    println!(
        "removing lifecycle hook {} created by ca-asg-provider, region {}{}",
        opts.name,
        cfg.region,
        if opts.dry_run { " (dry run)" } else { "" }
    );
    let cloud = crate::cloud::aws::connect(&cfg.aws_settings()).await;
    let run = remove_hooks(cloud.as_ref(), &cfg.provider.selector, &opts, |r| {
        println!("{}", r.line(&opts))
    });
    let reports = match tokio::time::timeout(args.timeout, run).await {
        Err(_) => {
            println!(
                "FAILED: not done within {} (--timeout): AWS answers too slowly or not at all; the groups above are done, run the command again for the rest",
                crate::duration::format_duration(args.timeout)
            );
            return ExitCode::FAILURE;
        }
        Ok(Err(why)) => {
            println!("FAILED: {why}");
            return ExitCode::FAILURE;
        }
        Ok(Ok(r)) => r,
    };
    let failed = reports.iter().filter(|r| r.failed()).count();
    let kept = reports
        .iter()
        .filter(|r| r.outcome == crate::scalein::remove_hooks::Outcome::KeptUnmarked)
        .count();
    if reports.is_empty() {
        println!("no group found with the configured names or discovery tags: nothing to remove");
    }
    if failed > 0 {
        println!(
            "{failed} of {} groups FAILED: their hooks still hold terminating instances for the hook's timeout; fix what each line says and run the command again",
            reports.len()
        );
        return ExitCode::FAILURE;
    }
    if kept > 0 {
        println!(
            "kept on {kept} group(s): a hook of this service's name with no record of its creator (see above); it holds terminating instances until removed"
        );
    }
    ExitCode::SUCCESS
}
