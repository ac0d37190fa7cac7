"""Quotas, in one place: which ResourceQuota forms count for a device resource (`forms`), every check of
a namespace's quotas against what the ledger counts (`checks`), the ResourceQuotas as last seen
(`store`), and every quota as the admin sees it (`report`: `gpupool quota`, the quota metrics, the
warnings). The ledger (webhook.pools.ledger) counts; admission and the queue ask these modules.
"""
