{{/*
The objects of the deploy/ manifests matching a glob under files/ (symlinks to deploy/'s
directories), parsed, each with the label deploy/kustomization.yaml gives every object.
Returned as YAML of {"items": [...]}, as `include` returns text.
*/}}
{{- define "bosun.objects" -}}
{{- $root := index . 0 -}}
{{- $items := list -}}
{{- range $path, $_ := $root.Files.Glob (index . 1) -}}
{{- range $doc := regexSplit "(?m)^---[ \\t]*$" ($root.Files.Get $path) -1 -}}
{{- $obj := fromYaml $doc -}}
{{- if and $obj $obj.kind -}}
{{- $labels := default dict $obj.metadata.labels -}}
{{- $_ := set $labels "app.kubernetes.io/part-of" "bosun" -}}
{{- $_ := set $obj.metadata "labels" $labels -}}
{{- $items = append $items $obj -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toYaml (dict "items" $items) -}}
{{- end -}}

{{/* The agent's admission policy names its service account in bosun-system. */}}
{{- define "bosun.namespace" -}}
{{- if ne .Release.Namespace "bosun-system" -}}
{{- fail (printf "Bosun installs into the namespace bosun-system, not %q: the agents' admission policy (deploy/admission/agent-own-node.yaml) names their service account there. Run: kubectl apply -f deploy/namespace.yaml, then helm install bosun deploy/helm/bosun -n bosun-system" .Release.Namespace) -}}
{{- end -}}
{{- end -}}

{{/* image: repository:tag, the tag defaulting to the chart's appVersion. */}}
{{- define "bosun.image" -}}
{{- printf "%s:%s" .image.repository (default .chart.AppVersion .image.tag) -}}
{{- end -}}

{{/* Sets the values every Bosun container takes: image, pull policy, resources, --instance. */}}
{{- define "bosun.container" -}}
{{- $c := .container -}}
{{- $_ := set $c "image" (include "bosun.image" (dict "image" .image "chart" .chart)) -}}
{{- if .pullPolicy -}}{{- $_ := set $c "imagePullPolicy" .pullPolicy -}}{{- end -}}
{{- if .resources -}}{{- $_ := set $c "resources" .resources -}}{{- end -}}
{{- if .instance -}}{{- $_ := set $c "args" (append $c.args (printf "--instance=%s" .instance)) -}}{{- end -}}
{{- end -}}
