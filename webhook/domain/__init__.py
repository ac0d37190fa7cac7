"""What gpupool knows, as plain values: nodes, Pods, quotas and pools (model), quantities and product
names, the policy file, and the errors a user can fix. Imports nothing else of gpupool's, and neither
flask, gunicorn nor kubernetes."""
