# Uninstall without the chart's Job (the kustomize overlays, the chart in sidecar mode):
# turns the Deployment the provider runs in into a one-off Job that runs
# `ca-asg-provider remove-hooks` with the same image, ServiceAccount (so the same IAM role),
# config file and mounts, bounded in time. docs/helm.md ("Uninstall") gives the commands:
#   kubectl -n kube-system get deployment DEPLOYMENT -o json \
#     | jq -f deploy/remove-hooks-job.jq | kubectl -n kube-system apply -f -
# tests/deploy/validate.py applies it to both overlays' Deployments and checks the Job.
.spec.template.spec as $pod
| ($pod.containers[] | select(.name == "ca-asg-provider")) as $c
| {apiVersion: "batch/v1", kind: "Job",
   metadata: {name: "ca-asg-provider-remove-hooks"},
   spec: {backoffLimit: 1, activeDeadlineSeconds: 180,
     template: {spec: ($pod
       | .restartPolicy = "Never"
       | del(.affinity, .topologySpreadConstraints, .initContainers)
       | .containers = [$c
           | {name: "remove-hooks", image, env, envFrom, securityContext, volumeMounts,
              args: ["remove-hooks", "--config", .args[(.args | index("--config")) + 1], "--timeout", "2m"]}
           | with_entries(select(.value != null))])}}}
