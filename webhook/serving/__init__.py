"""The admission webhook as a server: AdmissionReview in and out, the Flask app, gunicorn with a worker
that never waits on a client, the health port, metrics and log lines."""
