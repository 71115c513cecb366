package cuda

// testPTX holds the kernels of the GPU tests, hand-written PTX that the
// driver JIT-compiles for whatever GPU runs the tests (no NVRTC needed).
//
//	noop()                                   does nothing (launch benchmarks)
//	fill_u32(u32* dst, u32 n, u32 seed)      dst[i] = seed*i + 1, grid-stride loop
//	add_u32(u32* p, u32 n, u32 v)            p[i] += v, grid-stride loop
//	mixed(u64* out, u8 a, u16 b, u32 c, u64 d, f32 e, f64 f)
//	                                         out[0..5] = a, b, c, d, bits(e), bits(f) (zero-extended)
//	smem_rev(u32* out, u32 n)                one block: s[j] = 3j+7 in dynamic shared memory,
//	                                         barrier, out[j] = s[n-1-j]; n words of shared memory
//	grid_barrier(u32* counter, u32* out)     thread 0 of each block increments *counter and
//	                                         spins (bounded) until it reaches gridDim.x, then
//	                                         writes the value it saw to out[blockIdx.x]
const testPTX = `
.version 7.8
.target sm_80
.address_size 64

.extern .shared .align 16 .b8 goep_dsmem[];

.visible .entry noop()
{
	ret;
}

.visible .entry fill_u32(
	.param .u64 fill_u32_dst,
	.param .u32 fill_u32_n,
	.param .u32 fill_u32_seed
)
{
	.reg .pred %p<2>;
	.reg .b32 %r<10>;
	.reg .b64 %rd<4>;

	ld.param.u64 %rd1, [fill_u32_dst];
	ld.param.u32 %r1, [fill_u32_n];
	ld.param.u32 %r2, [fill_u32_seed];
	cvta.to.global.u64 %rd1, %rd1;
	mov.u32 %r3, %ctaid.x;
	mov.u32 %r4, %ntid.x;
	mov.u32 %r5, %tid.x;
	mad.lo.u32 %r6, %r3, %r4, %r5;
	mov.u32 %r7, %nctaid.x;
	mul.lo.u32 %r7, %r7, %r4;
$FILL_LOOP:
	setp.ge.u32 %p1, %r6, %r1;
	@%p1 bra $FILL_DONE;
	mul.lo.u32 %r8, %r2, %r6;
	add.u32 %r8, %r8, 1;
	mul.wide.u32 %rd2, %r6, 4;
	add.u64 %rd3, %rd1, %rd2;
	st.global.u32 [%rd3], %r8;
	add.u32 %r6, %r6, %r7;
	bra $FILL_LOOP;
$FILL_DONE:
	ret;
}

.visible .entry add_u32(
	.param .u64 add_u32_p,
	.param .u32 add_u32_n,
	.param .u32 add_u32_v
)
{
	.reg .pred %p<2>;
	.reg .b32 %r<10>;
	.reg .b64 %rd<4>;

	ld.param.u64 %rd1, [add_u32_p];
	ld.param.u32 %r1, [add_u32_n];
	ld.param.u32 %r2, [add_u32_v];
	cvta.to.global.u64 %rd1, %rd1;
	mov.u32 %r3, %ctaid.x;
	mov.u32 %r4, %ntid.x;
	mov.u32 %r5, %tid.x;
	mad.lo.u32 %r6, %r3, %r4, %r5;
	mov.u32 %r7, %nctaid.x;
	mul.lo.u32 %r7, %r7, %r4;
$ADD_LOOP:
	setp.ge.u32 %p1, %r6, %r1;
	@%p1 bra $ADD_DONE;
	mul.wide.u32 %rd2, %r6, 4;
	add.u64 %rd3, %rd1, %rd2;
	ld.global.u32 %r8, [%rd3];
	add.u32 %r8, %r8, %r2;
	st.global.u32 [%rd3], %r8;
	add.u32 %r6, %r6, %r7;
	bra $ADD_LOOP;
$ADD_DONE:
	ret;
}

.visible .entry mixed(
	.param .u64 mixed_out,
	.param .u8 mixed_a,
	.param .u16 mixed_b,
	.param .u32 mixed_c,
	.param .u64 mixed_d,
	.param .f32 mixed_e,
	.param .f64 mixed_f
)
{
	.reg .b16 %h<3>;
	.reg .b32 %r<4>;
	.reg .b64 %rd<10>;
	.reg .f32 %f<2>;
	.reg .f64 %fd<2>;

	ld.param.u64 %rd1, [mixed_out];
	cvta.to.global.u64 %rd1, %rd1;
	ld.param.u8 %h1, [mixed_a];
	ld.param.u16 %h2, [mixed_b];
	ld.param.u32 %r1, [mixed_c];
	ld.param.u64 %rd2, [mixed_d];
	ld.param.f32 %f1, [mixed_e];
	ld.param.f64 %fd1, [mixed_f];
	cvt.u64.u16 %rd3, %h1;
	st.global.u64 [%rd1], %rd3;
	cvt.u64.u16 %rd4, %h2;
	st.global.u64 [%rd1+8], %rd4;
	cvt.u64.u32 %rd5, %r1;
	st.global.u64 [%rd1+16], %rd5;
	st.global.u64 [%rd1+24], %rd2;
	mov.b32 %r2, %f1;
	cvt.u64.u32 %rd6, %r2;
	st.global.u64 [%rd1+32], %rd6;
	mov.b64 %rd7, %fd1;
	st.global.u64 [%rd1+40], %rd7;
	ret;
}

.visible .entry smem_rev(
	.param .u64 smem_rev_out,
	.param .u32 smem_rev_n
)
{
	.reg .pred %p<3>;
	.reg .b32 %r<12>;
	.reg .b64 %rd<4>;

	ld.param.u64 %rd1, [smem_rev_out];
	ld.param.u32 %r1, [smem_rev_n];
	cvta.to.global.u64 %rd1, %rd1;
	mov.u32 %r2, goep_dsmem;
	mov.u32 %r3, %tid.x;
	mov.u32 %r4, %ntid.x;
	mov.u32 %r5, %r3;
$SMEM_W_LOOP:
	setp.ge.u32 %p1, %r5, %r1;
	@%p1 bra $SMEM_W_DONE;
	mul.lo.u32 %r6, %r5, 3;
	add.u32 %r6, %r6, 7;
	shl.b32 %r7, %r5, 2;
	add.u32 %r7, %r2, %r7;
	st.shared.u32 [%r7], %r6;
	add.u32 %r5, %r5, %r4;
	bra $SMEM_W_LOOP;
$SMEM_W_DONE:
	bar.sync 0;
	mov.u32 %r5, %r3;
$SMEM_R_LOOP:
	setp.ge.u32 %p2, %r5, %r1;
	@%p2 bra $SMEM_R_DONE;
	sub.u32 %r8, %r1, 1;
	sub.u32 %r8, %r8, %r5;
	shl.b32 %r9, %r8, 2;
	add.u32 %r9, %r2, %r9;
	ld.shared.u32 %r10, [%r9];
	mul.wide.u32 %rd2, %r5, 4;
	add.u64 %rd3, %rd1, %rd2;
	st.global.u32 [%rd3], %r10;
	add.u32 %r5, %r5, %r4;
	bra $SMEM_R_LOOP;
$SMEM_R_DONE:
	ret;
}

.visible .entry grid_barrier(
	.param .u64 grid_barrier_counter,
	.param .u64 grid_barrier_out
)
{
	.reg .pred %p<4>;
	.reg .b32 %r<8>;
	.reg .b64 %rd<5>;

	mov.u32 %r1, %tid.x;
	setp.ne.u32 %p1, %r1, 0;
	@%p1 bra $GB_DONE;
	ld.param.u64 %rd1, [grid_barrier_counter];
	ld.param.u64 %rd2, [grid_barrier_out];
	cvta.to.global.u64 %rd1, %rd1;
	cvta.to.global.u64 %rd2, %rd2;
	mov.u32 %r2, %nctaid.x;
	atom.global.add.u32 %r3, [%rd1], 1;
	mov.u32 %r4, 0;
$GB_SPIN:
	ld.volatile.global.u32 %r5, [%rd1];
	setp.ge.u32 %p2, %r5, %r2;
	@%p2 bra $GB_OUT;
	add.u32 %r4, %r4, 1;
	setp.lt.u32 %p3, %r4, 20000000;
	@%p3 bra $GB_SPIN;
$GB_OUT:
	mov.u32 %r6, %ctaid.x;
	mul.wide.u32 %rd3, %r6, 4;
	add.u64 %rd4, %rd2, %rd3;
	st.global.u32 [%rd4], %r5;
$GB_DONE:
	ret;
}
`
