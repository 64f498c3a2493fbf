# Sourced by the device scripts: joins and installs the CUDA MLX wheels
# carried in two halves, and points the loader at them (see docs/benchmarks.md).
cat /tmp/mlxparts/part_aa .gpu_b/part_ab > /tmp/mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl
python3 -m pip install -q --no-index --no-deps --target /tmp/site /tmp/mlx_cuda_13-*.whl .gpu_b/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
NV=$(python3 -c "import nvidia,os,glob; print(':'.join(sorted(glob.glob(os.path.join(list(nvidia.__path__)[0],'*','lib')))))")
export LD_LIBRARY_PATH="/tmp/site/mlx/lib:$PWD/.device/lib:$NV"
H=.device/host; P=.device/plugins
