//! The demo runs its full cycle (scale-up, pods, drain scale-in) by itself.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_runs_a_full_cycle() {
    ca_asg_provider::commands::demo::run(ca_asg_provider::commands::demo::DemoArgs {
        launch_seconds: 0.2,
    })
    .await
    .expect("the demo finishes without an error");
}
