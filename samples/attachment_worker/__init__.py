"""The attachment worker of the operational card: transcode claims attachments exactly once.

``python -m samples.attachment_worker`` runs the worker (settings from the
environment); ``python -m samples.attachment_worker.demo`` runs the whole
thing against local emulators. See this folder's README.
"""
