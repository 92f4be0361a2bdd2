{{/*
Sluice as a sidecar in an application's chart. Add this chart as a
dependency named "sluice" (values under sluice:, mode: sidecar), then in the
application's pod template:

  metadata:
    labels:
      {{- include "sluice.sidecar.podLabels" . | nindent 8 }}
    annotations:
      {{- include "sluice.sidecar.podAnnotations" . | nindent 8 }}
  spec:
    terminationGracePeriodSeconds: {{ include "sluice.sidecar.terminationGracePeriodSeconds" . }}
    securityContext:
      {{- include "sluice.sidecar.podSecurityContext" . | nindent 6 }}
    containers:   # or initContainers, with sluice.sidecar.native
      {{- include "sluice.sidecar" . | nindent 6 }}
    volumes:
      {{- include "sluice.sidecar.volumes" . | nindent 6 }}

The application talks to pulsar://localhost:6650. docs/kubernetes.md has the
whole example (deploy/helm/examples/orders).
*/}}

{{/* The sluice container, a list item. */}}
{{- define "sluice.sidecar" -}}
{{- $ctx := include "sluice.context" . | fromYaml -}}
{{- if ne $ctx.Values.mode "sidecar" -}}
{{- fail "include \"sluice.sidecar\" needs sluice.mode: sidecar in the application's values" -}}
{{- end -}}
{{- include "sluice.container" $ctx -}}
{{- end -}}

{{/* Its volumes, list items. */}}
{{- define "sluice.sidecar.volumes" -}}
{{- include "sluice.volumes" (include "sluice.context" . | fromYaml) -}}
{{- end -}}

{{/* The label the sidecar's metrics Service and NetworkPolicy select. */}}
{{- define "sluice.sidecar.podLabels" -}}
{{- include "sluice.sidecarLabel" (include "sluice.context" . | fromYaml) -}}
{{- end -}}

{{/* Prometheus' scrape annotations and the configuration's checksum. */}}
{{- define "sluice.sidecar.podAnnotations" -}}
{{- include "sluice.podAnnotations" (include "sluice.context" . | fromYaml) -}}
{{- end -}}

{{/* The drain plus the time to exit: the pod's terminationGracePeriodSeconds
(the application's own, if longer, wins). */}}
{{- define "sluice.sidecar.terminationGracePeriodSeconds" -}}
{{- include "sluice.gracePeriod" (include "sluice.context" . | fromYaml) -}}
{{- end -}}

{{/* The pod's fsGroup, which makes the mounted Secrets readable by the
sidecar (it runs with this group). */}}
{{- define "sluice.sidecar.podSecurityContext" -}}
{{- $ctx := include "sluice.context" . | fromYaml -}}
fsGroup: {{ $ctx.Values.podSecurityContext.fsGroup }}
{{- end -}}
