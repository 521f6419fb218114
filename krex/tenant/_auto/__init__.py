"""Holds the sitecustomize that KREX_AUTO_REGIONS needs (see krex.tenant.autoregions).

This directory goes first on a tenant's PYTHONPATH so that Python imports our sitecustomize.py
as `sitecustomize`; it is a package only so that it is installed with krex.
"""
