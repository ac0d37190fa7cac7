"""The steps manifests/render.py runs, one concern per module (standard library only, like render.py).

- `errors`: RenderError, a failed step printed as one line.
- `kustomization`: the scratch kustomization's text (components, image, ConfigMap, JSON patches), pure.
- `build`: files and processes: the certificates, the scratch copy of manifests/, `kubectl kustomize`,
  the private output file; `render` for `make manifests`.
- `release`: `make release`'s files and the checks that the tree names the version.
"""
