# Uninstall without the chart's Job (the kustomize overlays, the chart in sidecar mode):
# turns the Deployment the provider runs in into a one-off Job that runs
# `ca-asg-provider remove-hooks` with the same image, ServiceAccount (so the same IAM role),
# config file and mounts, bounded in time. docs/helm.md ("Uninstall") gives the commands:
#   kubectl -n kube-system get deployment DEPLOYMENT -o json \
#     | jq -f deploy/remove-hooks-job.jq | kubectl -n kube-system apply -f -
# The provider is the container named ca-asg-provider, in the pod's `containers` (the
# overlays, the chart's standalone and bundled modes) or in its `initContainers` (the
# chart's sidecar mode: a native sidecar, `restartPolicy: Always`, in CA's Deployment).
# The Job's pod keeps the Deployment's ServiceAccount and volumes and runs that one
# container only (not CA's, no init containers). No provider, or a provider without
# `--config PATH` / `--config=PATH`: jq stops with an error saying so and prints nothing.
# tests/deploy/validate.py applies it to both overlays' Deployments and to the Deployment
# CA's chart renders from deploy/chart/examples/cluster-autoscaler-values.yaml.
def names: [(. // [])[] | .name] | if length == 0 then "none" else join(", ") end;
# The value of --config in a container's command line: `--config PATH` or `--config=PATH`
# (the last one given wins); null when there is none.
def config_path:
  ((.command // []) + (.args // [])) as $a
  | [range(0; $a | length) as $i
      | if $a[$i] == "--config" then $a[$i + 1]
        elif ($a[$i] | type) == "string" and ($a[$i] | startswith("--config=")) then $a[$i][9:]
        else empty end
      | select(type == "string" and length > 0)]
  | last;
"\(.kind // "object")/\(.metadata.name // "?")" as $what
| (.spec.template.spec // {}) as $pod
| [($pod.containers // [])[], ($pod.initContainers // [])[] | select(.name == "ca-asg-provider")] as $found
| if ($found | length) == 0 then
    error("remove-hooks-job.jq: no container named ca-asg-provider in \($what): looked in .spec.template.spec.containers "
      + "(\($pod.containers | names)) and .spec.template.spec.initContainers (\($pod.initContainers | names)); "
      + "give it the Deployment the provider runs in (kubectl get deployment NAME -o json)")
  else . end
| $found[0] as $c
| ($c | config_path) as $config
| if $config == null then
    error("remove-hooks-job.jq: the ca-asg-provider container of \($what) has no --config PATH (or --config=PATH) "
      + "in its command or args (\(($c.command // []) + ($c.args // []) | tojson)): remove-hooks needs the provider's config file")
  else . end
| {apiVersion: "batch/v1", kind: "Job",
   metadata: {name: "ca-asg-provider-remove-hooks"},
   spec: {backoffLimit: 1, activeDeadlineSeconds: 180,
     template: {spec: ($pod
       | .restartPolicy = "Never"
       | del(.affinity, .topologySpreadConstraints, .initContainers)
       | .containers = [$c
           | {name: "remove-hooks", image, env, envFrom, securityContext, volumeMounts,
              args: ["remove-hooks", "--config", $config, "--timeout", "2m"]}
           | with_entries(select(.value != null))])}}}
