{{/*
Availability of the Deployments whose pods take over from one another: mTLS mode's schedext
replicas (leader election: a standby takes the Lease when the leader goes) and the second
kube-scheduler's hot standbys. With more than one replica, each gets a PodDisruptionBudget,
so that a drain leaves one running, and a pod anti-affinity on the node's hostname, so that
one node going down does not take every replica. Arguments: `root` the chart, `group` the
values group (.Values.schedext or .Values.scheduler), `name` the component (the selector's
app.kubernetes.io/name), `object` the Deployment's name.
*/}}

{{/*
nodeSelector, tolerations, affinity, priorityClassName and topologySpreadConstraints of the
pod spec: schedext.placement of the group, its affinity given the default anti-affinity
(group.podAntiAffinity: preferred or required) when it runs several replicas and the user's
affinity names no podAntiAffinity of its own. A topologySpreadConstraint without a
labelSelector selects the Deployment's own pods.
*/}}
{{- define "schedext.spreadPlacement" -}}
{{- $group := deepCopy .group }}
{{- $selector := include "schedext.selectorLabels" . | fromYaml }}
{{- $affinity := deepCopy ($group.affinity | default dict) }}
{{- $mode := $group.podAntiAffinity | default "preferred" }}
{{- if and (gt (int $group.replicas) 1) (ne $mode "none") (not (hasKey $affinity "podAntiAffinity")) }}
{{- $term := dict "topologyKey" "kubernetes.io/hostname" "labelSelector" (dict "matchLabels" $selector) }}
{{- if eq $mode "required" }}
{{- $_ := set $affinity "podAntiAffinity" (dict "requiredDuringSchedulingIgnoredDuringExecution" (list $term)) }}
{{- else }}
{{- $_ := set $affinity "podAntiAffinity" (dict "preferredDuringSchedulingIgnoredDuringExecution" (list (dict "weight" 100 "podAffinityTerm" $term))) }}
{{- end }}
{{- end }}
{{- $_ := set $group "affinity" $affinity }}
{{- include "schedext.placement" $group }}
{{- $constraints := list }}
{{- range $group.topologySpreadConstraints }}
{{- $constraint := deepCopy . }}
{{- if not (hasKey $constraint "labelSelector") }}
{{- $_ := set $constraint "labelSelector" (dict "matchLabels" $selector) }}
{{- end }}
{{- $constraints = append $constraints $constraint }}
{{- end }}
{{- with $constraints }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
The PodDisruptionBudget of a Deployment of several replicas (group.pdb.enabled): at least
group.pdb.minAvailable of its pods stay through voluntary disruptions (drains, evictions).
None with one replica, where minAvailable 1 would block every drain of its node. A
minAvailable as large as the replicas would do the same, and fails the render.
*/}}
{{- define "schedext.pdb" -}}
{{- $group := .group }}
{{- /* Defaults where the values lack them: `helm upgrade --reuse-values` from chart 0.1.0
keeps that chart's values, which had no pdb. */}}
{{- $pdb := $group.pdb | default dict }}
{{- $enabled := ternary $pdb.enabled true (hasKey $pdb "enabled") }}
{{- $min := ternary $pdb.minAvailable 1 (hasKey $pdb "minAvailable") }}
{{- if and $enabled (gt (int $group.replicas) 1) }}
{{- if and (not (kindIs "string" $min)) (ge (int $min) (int $group.replicas)) }}
{{- fail (printf "the PodDisruptionBudget of %s: pdb.minAvailable (%d) must be below its replicas (%d), or no node it runs on could ever be drained" .object (int $min) (int $group.replicas)) }}
{{- end }}
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ .object }}
  namespace: {{ .root.Release.Namespace }}
  labels:
    {{- include "schedext.labels" (dict "name" .name "root" .root) | nindent 4 }}
spec:
  minAvailable: {{ $min }}
  selector:
    matchLabels:
      {{- include "schedext.selectorLabels" . | nindent 6 }}
{{- end }}
{{- end }}
