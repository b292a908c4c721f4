"""What each model file an official template names is (issue 31 item 3): the table from
file name to the architecture its loader and name imply, for the stand-in builders.

A stand-in is a tiny random model of that architecture, made with ComfyUI's own classes
and found by ComfyUI's own detection. The table is written by hand from the names (and
ComfyUI's detection); `architecture()` answers for one (loader, file, CLIP type) and a
name the table does not know is a listed failure, never a skip.

Architectures are "kind:name": the kind says which loader folder the file goes in and
which builder makes it; the name is ComfyUI's (its supported_models class, text-encoder
detection or VAE class), lower-case.
"""

# the folder under models/ each kind's files go in (ComfyUI's folder_paths names)
FOLDERS = {"diffusion": "diffusion_models", "checkpoint": "checkpoints",
           "te": "text_encoders", "vae": "vae", "lora": "loras", "controlnet": "controlnet",
           "clip_vision": "clip_vision", "latent_upscaler": "latent_upscale_models",
           "model_patch": "model_patches", "style_model": "style_models",
           "upscaler": "upscale_models", "audio_encoder": "audio_encoders",
           "frame_interpolation": "frame_interpolation", "optical_flow": "optical_flow",
           "background_removal": "background_removal", "geometry": "geometry_estimation"}

# loader node -> the kind of file each of its file inputs loads
LOADERS = {"UNETLoader": "diffusion", "CheckpointLoaderSimple": "checkpoint",
           "ImageOnlyCheckpointLoader": "checkpoint", "CLIPLoader": "te",
           "DualCLIPLoader": "te", "TripleCLIPLoader": "te", "QuadrupleCLIPLoader": "te",
           "LTXAVTextEncoderLoader": "te", "VAELoader": "vae", "LTXVAudioVAELoader": "vae",
           "LoraLoader": "lora", "LoraLoaderModelOnly": "lora",
           "ControlNetLoader": "controlnet", "DiffControlNetLoader": "controlnet",
           "CLIPVisionLoader": "clip_vision", "LatentUpscaleModelLoader": "latent_upscaler",
           "ModelPatchLoader": "model_patch", "StyleModelLoader": "style_model",
           "UpscaleModelLoader": "upscaler", "AudioEncoderLoader": "audio_encoder",
           "FrameInterpolationModelLoader": "frame_interpolation",
           "OpticalFlowLoader": "optical_flow", "LoadBackgroundRemovalModel":
           "background_removal", "LoadMoGeModel": "geometry", "LoadDA3Model": "geometry"}


def _names(arch, *names):
    return {n: arch for n in names}


DIFFUSION = {
    **_names("flux", "flux1-dev.safetensors", "flux1-dev-fp8.safetensors",
             "flux1-dev-kontext_fp8_scaled.safetensors",
             "flux1-krea-dev_fp8_scaled.safetensors"),
    # PiD decodes a Flux latent in pixel space: PixelDiT with an LQ branch (standins_pid.py)
    **_names("pid", "pid_flux1_1024_to_4096_4step_bf16.safetensors"),
    **_names("flux_schnell", "flux1-schnell.safetensors"),
    **_names("flux_inpaint", "flux1-fill-dev.safetensors",
             "flux.1-fill-dev-OneReward-transformer_fp8.safetensors"),
    **_names("flux_canny", "flux1-canny-dev.safetensors"),
    **_names("flux2", "flux2_dev_fp8mixed.safetensors"),
    **_names("flux2_klein_4b", "flux-2-klein-4b.safetensors", "flux-2-klein-4b-fp8.safetensors",
             "flux-2-klein-base-4b-fp8.safetensors",
             "flux-2-klein-base-4b.safetensors"),
    **_names("flux2_klein_9b", "flux-2-klein-9b-fp8.safetensors", "flux-2-klein-9b-kv-fp8.safetensors",
             "flux-2-klein-base-9b-fp8.safetensors"),
    **_names("chroma", "Chroma1-HD-fp8mixed.safetensors"),
    **_names("chroma_radiance", "chroma-radiance-x0.safetensors"),
    **_names("hidream", "hidream_i1_dev_fp8.safetensors", "hidream_i1_fast_fp8.safetensors",
             "hidream_i1_full_fp8.safetensors", "hidream_e1_1_bf16.safetensors",
             "hidream_e1_full_bf16.safetensors"),
    **_names("qwen_image", "qwen_image_fp8_e4m3fn.safetensors", "qwen_image_2512_fp8_e4m3fn.safetensors",
             "qwen_image_edit_fp8_e4m3fn.safetensors", "qwen_image_edit_2509_fp8_e4m3fn.safetensors",
             "qwen_image_edit_2511_bf16.safetensors", "qwen_image_edit_2511_fp8mixed.safetensors",
             "qwen_image_edit_2511_int8_convrot.safetensors",
             "FireRed-Image-Edit-1.1-transformer.safetensors"),
    **_names("qwen_image_layered", "qwen_image_layered_bf16.safetensors",
             "qwen_image_layered_control_bf16.safetensors"),
    **_names("wan21_t2v", "wan2.1_t2v_1.3B_fp16.safetensors", "wan2.1_t2v_14B_fp8_scaled.safetensors"),
    # Wan 2.1 T2V's weights; its metadata names the causal class (standins_causal_wan.py)
    **_names("wan21_causal_ar", "causal_forcing-framewise.safetensors"),
    **_names("cogvideox_fun_inpaint", "void_pass1.safetensors", "void_pass2.safetensors"),
    **_names("wan21_flf2v", "wan2.1_flf2v_720p_14B_fp16.safetensors"),
    **_names("wan21_i2v", "wan2.1_i2v_480p_14B_fp16.safetensors",
             "Wan2_1-I2V-ATI-14B_fp8_e4m3fn.safetensors",
             "Wan21-WanMove_fp8_scaled_e4m3fn_KJ.safetensors", "chrono_edit_14B_fp16.safetensors"),
    # InfiniteTalk's model (its speaker map needs 2 heads or more: standins_wan_more.py)
    **_names("wan21_i2v_multihead", "Wan2_1-I2V-14B-480p_fp8_e4m3fn_scaled_KJ.safetensors"),
    **_names("wan21_fun_inp", "wan2.1_fun_inp_1.3B_bf16.safetensors"),
    **_names("wan21_fun_control", "wan2.1_fun_control_1.3B_bf16.safetensors"),
    **_names("wan21_camera", "wan2.1_fun_camera_v1.1_1.3B_bf16.safetensors",
             "wan2.1_fun_camera_v1.1_14B_bf16.safetensors"),
    **_names("wan21_vace", "wan2.1_vace_14B_fp16.safetensors", "wan2.1_vace_1.3B_fp16.safetensors"),
    **_names("wan21_humo", "humo_17B_fp8_e4m3fn.safetensors"),
    **_names("wan21_scail2", "wan2.1_14B_SCAIL_2_fp16.safetensors", "wan2.1_14B_SCAIL_2_int8_convrot.safetensors"),
    **_names("wan22_5b", "wan2.2_ti2v_5B_fp16.safetensors"),
    **_names("wan22_5b_fun", "wan2.2_fun_control_5B_bf16.safetensors"),
    **_names("wan22_5b_fun_inp", "wan2.2_fun_inpaint_5B_bf16.safetensors"),
    **_names("wan22_a14b_t2v", "wan2.2_t2v_high_noise_14B_fp8_scaled.safetensors",
             "wan2.2_t2v_low_noise_14B_fp8_scaled.safetensors",
             "wan2.2_bernini_r_high_noise_fp8_scaled.safetensors",
             "wan2.2_bernini_r_low_noise_fp8_scaled.safetensors"),
    **_names("wan22_a14b_i2v", "wan2.2_i2v_high_noise_14B_fp8_scaled.safetensors",
             "wan2.2_i2v_low_noise_14B_fp8_scaled.safetensors"),
    **_names("wan22_a14b_fun_inp", "wan2.2_fun_inpaint_high_noise_14B_fp8_scaled.safetensors",
             "wan2.2_fun_inpaint_low_noise_14B_fp8_scaled.safetensors"),
    **_names("wan22_a14b_fun_control", "wan2.2_fun_control_high_noise_14B_fp8_scaled.safetensors",
             "wan2.2_fun_control_low_noise_14B_fp8_scaled.safetensors"),
    **_names("wan22_camera", "wan2.2_fun_camera_high_noise_14B_fp8_scaled.safetensors",
             "wan2.2_fun_camera_low_noise_14B_fp8_scaled.safetensors"),
    **_names("wan22_s2v", "wan2.2_s2v_14B_fp8_scaled.safetensors"),
    **_names("wan22_dancer", "wan2.2_dancer_14b_global_fp8_scaled.safetensors",
             "wan2.2_dancer_14b_local_fp8_scaled.safetensors"),
    **_names("hunyuan_video", "hunyuan_video_t2v_720p_bf16.safetensors"),
    # Capybara v0.1 is a HunyuanVideo 1.5 model (its templates use HunyuanVideo 1.5's nodes)
    **_names("hunyuan_video15", "hunyuanvideo1.5_720p_t2v_fp16.safetensors",
             "hunyuanvideo1.5_720p_i2v_fp16.safetensors", "capybara_v0.1.safetensors"),
    **_names("hunyuan_video15_sr_distilled", "hunyuanvideo1.5_1080p_sr_distilled_fp16.safetensors"),
    **_names("newbie", "NewBie-Image-Exp0.1-bf16.safetensors"),   # Lumina 2 + Jina pooled
    **_names("zimage", "z_image_bf16.safetensors", "z_image_int8_convrot.safetensors",
             "z_image_turbo_bf16.safetensors", "z_image_turbo_int8_convrot.safetensors"),
    **_names("omnigen2", "omnigen2_fp16.safetensors"),
    **_names("boogu", "boogu_image_edit_fp8_scaled.safetensors", "boogu_image_edit_int8_convrot.safetensors",
             "boogu_image_turbo_fp8_scaled.safetensors"),
    **_names("kandinsky5", "kandinsky5lite_t2v_sft_5s.safetensors", "kandinsky5lite_i2v_5s.safetensors"),
    **_names("kandinsky5_image", "kandinsky5lite_t2i.safetensors"),
    **_names("ace_step15", "acestep_v1.5_turbo.safetensors", "acestep_v1.5_xl_base_bf16.safetensors",
             "acestep_v1.5_xl_sft_bf16.safetensors", "acestep_v1.5_xl_turbo_bf16.safetensors"),
    **_names("anima", "anima-base-v1.0.safetensors", "anima-preview3-base.safetensors"),
    **_names("ernie_image", "ernie-image.safetensors", "ernie-image-turbo.safetensors"),
    **_names("ideogram4", "ideogram4_fp8_scaled.safetensors", "ideogram4_int8_convrot.safetensors",
             "ideogram4_unconditional_fp8_scaled.safetensors",
             "ideogram4_unconditional_int8_convrot.safetensors"),
    **_names("joyimage", "joyai_image_edit_int8_convrot.safetensors"),
    **_names("krea2", "krea2_turbo_fp8_scaled.safetensors", "krea2_turbo_int8_convrot.safetensors"),
    **_names("lens", "lens_bf16.safetensors", "lens_turbo_bf16.safetensors"),
    **_names("longcat_image", "longcat_image_bf16.safetensors", "longcat_image_edit_bf16.safetensors"),
    **_names("lotus_d", "lotus-depth-d-v1-1.safetensors"),
    **_names("mage_flow", "mage_flow_int8_convrot.safetensors", "mage_flow_turbo_int8_convrot.safetensors",
             "mage_flow_edit_int8_convrot.safetensors", "mage_flow_edit_turbo_int8_convrot.safetensors"),
    **_names("moss_image", "moss_image_base_int8_convrot.safetensors", "moss_image_sft_int8_convrot.safetensors"),
    **_names("ovis_image", "ovis_image_bf16.safetensors"),
    **_names("pixeldit", "pixeldit_1300m_1024px_bf16.safetensors"),
    **_names("rt_detr_v4", "rt_detr_v4-x-hgnet_fp16.safetensors"),
    **_names("seedvr2_3b", "seedvr2_3b_int8_convrot.safetensors"),
    **_names("seedvr2_7b", "seedvr2_7b_int8_convrot.safetensors"),
    **_names("triposplat", "triposplat_fp16.safetensors"),
}

CHECKPOINTS = {
    **_names("sdxl", "sd_xl_base_1.0.safetensors", "sd_xl_turbo_1.0_fp16.safetensors"),
    **_names("sdxl_refiner", "sd_xl_refiner_1.0.safetensors"),
    **_names("sd3", "sd3.5_large_fp8_scaled.safetensors"),
    **_names("flux", "flux1-dev-fp8.safetensors"),
    **_names("flux_schnell", "flux1-schnell-fp8.safetensors"),
    **_names("ltxv", "ltx-video-2b-v0.9.safetensors", "ltx-video-2b-v0.9.5.safetensors"),
    **_names("ltxav", "ltx-2-19b-dev.safetensors", "ltx-2-19b-dev-fp8.safetensors",
             "ltx-2-19b-distilled.safetensors", "ltx-2.3-22b-dev-fp8.safetensors",
             "ltx-2.3-22b-distilled-fp8.safetensors"),
    **_names("ace_step", "ace_step_v1_3.5b.safetensors"),
    **_names("ace_step15", "ace_step_1.5_turbo_aio.safetensors"),
    **_names("hidream_o1", "hidream_o1_image_bf16.safetensors", "hidream_o1_image_dev_fp8_scaled.safetensors"),
    **_names("lumina2", "NetaYumev35_pretrained_all_in_one.safetensors"),
    **_names("sam31", "sam3.1_multiplex_fp16.safetensors"),
    **_names("sdpose", "sdpose_wholebody_fp16.safetensors"),
    **_names("stable_audio", "stable-audio-open-1.0.safetensors"),
    **_names("stable_audio3", "stable_audio_3_medium.safetensors", "stable_audio_3_medium_base.safetensors"),
    **_names("svd", "svd_xt.safetensors"),
    **_names("hunyuan3d2", "hunyuan3d-dit-v2-mv_fp16.safetensors", "hunyuan3d-dit-v2-mv-turbo_fp16.safetensors",
             "hunyuan3d-dit-v2_fp16.safetensors"),
    **_names("hunyuan3d21", "hunyuan_3d_v2.1.safetensors"),
}

# text encoders by file; what a CLIP loader builds from them also depends on its type
TEXT_ENCODERS = {
    **_names("clip_l", "clip_l.safetensors", "clip_l_hidream.safetensors"),
    **_names("clip_g", "clip_g_hidream.safetensors"),
    **_names("t5xxl", "t5xxl_fp16.safetensors", "t5xxl_fp8_e4m3fn_scaled.safetensors"),
    **_names("t5_base", "t5-base.safetensors"),
    **_names("t5gemma", "t5gemma_b_b_ul2.safetensors"),
    **_names("umt5xxl", "umt5_xxl_fp16.safetensors", "umt5_xxl_fp8_e4m3fn_scaled.safetensors"),
    **_names("byt5_small", "byt5_small_glyphxl_fp16.safetensors"),
    **_names("qwen25_7b", "qwen_2.5_vl_7b.safetensors", "qwen_2.5_vl_7b_fp8_scaled.safetensors"),
    # OmniGen2's Qwen2.5-VL 3B (ComfyUI's loader: "omnigen2: qwen vl 2.5 3B")
    **_names("qwen25_3b", "qwen_2.5_vl_fp16.safetensors"),
    **_names("qwen3_06b", "qwen_3_06b_base.safetensors", "qwen_0.6b_ace15.safetensors"),
    **_names("qwen3_17b", "qwen_1.7b_ace15.safetensors"),
    **_names("qwen3_4b", "qwen_3_4b.safetensors", "qwen_3_4b_fp8_mixed.safetensors", "qwen_4b_ace15.safetensors"),
    **_names("qwen3_8b", "qwen_3_8b_fp8mixed.safetensors"),
    **_names("qwen35_2b", "qwen3.5_2b_bf16.safetensors"),
    **_names("qwen35_4b", "qwen3.5_4b_bf16.safetensors"),
    **_names("qwen35_9b", "qwen3.5_9b_w4a8_gptq.safetensors"),
    **_names("qwen3vl_4b", "qwen3vl_4b_bf16.safetensors", "qwen3vl_4b_fp8_scaled.safetensors"),
    **_names("qwen3vl_8b", "qwen3vl_8b_fp8_scaled.safetensors", "qwen3vl_8b_joyimage_edit_int8_convrot.safetensors"),
    **_names("llama31_8b", "llama_3.1_8b_instruct_fp8_scaled.safetensors"),
    **_names("llava_llama3", "llava_llama3_fp8_scaled.safetensors"),
    **_names("gemma2_2b", "gemma_2_2b_it_elm_bf16.safetensors", "gemma_2_2b_it_elm_fp8_scaled.safetensors"),
    **_names("gemma3_4b", "gemma_3_4b_it_bf16.safetensors"),
    **_names("gemma3_12b", "gemma_3_12B_it.safetensors", "gemma_3_12B_it_fp4_mixed.safetensors"),
    **_names("gemma4_e4b", "gemma4_e4b_it_fp8_scaled.safetensors"),
    **_names("jina_clip_v2", "jina_clip_v2_bf16.safetensors"),
    **_names("mistral3_24b", "mistral_3_small_flux2_bf16.safetensors", "mistral_3_small_flux2_fp8.safetensors"),
    **_names("ministral3_3b", "ministral-3-3b.safetensors", "ernie-image-prompt-enhancer.safetensors"),
    **_names("ovis25", "ovis_2.5.safetensors"),
    **_names("gpt_oss_20b", "gpt_oss_20b_nvfp4.safetensors"),
    # LTX-2's text encoder loader reads the Gemma 3 file and the checkpoint's projection
    **{n: "ltxav_projection" for n in CHECKPOINTS if CHECKPOINTS[n] == "ltxav"},
}

VAES = {
    **_names("sd_vae", "vae-ft-mse-840000-ema-pruned.safetensors"),
    **_names("flux_vae", "ae.safetensors"),
    **_names("flux2_vae", "flux2-vae.safetensors"),
    **_names("flux2_vae_small", "flux2-vae_small.safetensors", "full_encoder_small_decoder.safetensors"),
    **_names("wan21_vae", "wan_2.1_vae.safetensors", "Wan2_1_VAE_bf16.safetensors",
             "wan_alpha_2.1_vae_alpha_channel.safetensors", "wan_alpha_2.1_vae_rgb_channel.safetensors"),
    **_names("wan22_vae", "wan2.2_vae.safetensors"),
    **_names("qwen_image_vae", "qwen_image_vae.safetensors"),
    **_names("qwen_image_layered_vae", "qwen_image_layered_vae.safetensors"),
    **_names("hunyuan_video_vae", "hunyuan_video_vae_bf16.safetensors"),
    **_names("hunyuan_video15_vae", "hunyuanvideo15_vae_fp16.safetensors"),
    **_names("cogvideox_vae", "cogvideox_vae.safetensors"),
    **_names("ace15_vae", "ace_1.5_vae.safetensors"),
    **_names("mage_flow_vae", "mage_flow_vae_bf16.safetensors"),
    **_names("seedvr2_vae", "seedvr2_ema_vae_fp16.safetensors"),
    **_names("triposplat_vae", "triposplat_vae_decoder_fp16.safetensors"),
    # LTX-2's audio VAE travels in its checkpoint
    **{n: "ltxav_audio_vae" for n in CHECKPOINTS if CHECKPOINTS[n] == "ltxav"},
}

CLIP_VISION = {
    **_names("clip_vision_h", "clip_vision_h.safetensors"),
    **_names("clip_vision_g", "clip_vision_g.safetensors"),
    **_names("siglip_384", "sigclip_vision_patch14_384.safetensors"),
    **_names("dino_v3_h", "dino_v3_vit_h.safetensors"),
}

# a LoRA matches the base it was trained for: the stand-in patches that base's stand-in
LORAS = {
    **_names("qwen_image", "FireRed-Image-Edit-1.0-Lightning-8steps-v1.0.safetensors",
             "QWEN_EDIT_ACTION_V1.safetensors", "Qwen-Edit-2509-Multiple-angles.safetensors",
             "Qwen-Image-2512-Lightning-4steps-V1.0-fp32.safetensors",
             "Qwen-Image-Edit-2509-Anything2RealAlpha.safetensors",
             "Qwen-Image-Edit-2509-Light-Migration.safetensors",
             "Qwen-Image-Edit-2509-Lightning-4steps-V1.0-bf16.safetensors",
             "Qwen-Image-Edit-2509-Lightning-8steps-V1.0-bf16.safetensors",
             "Qwen-Image-Edit-2509-Relight.safetensors",
             "Qwen-Image-Edit-2511-Lightning-4steps-V1.0-bf16.safetensors",
             "Qwen-Image-Edit-Lightning-4steps-V1.0-bf16.safetensors",
             "Qwen-Image-Lightning-4steps-V1.0.safetensors", "Qwen-Image-Lightning-8steps-V1.0.safetensors",
             "Qwen_Image_Edit_2511-SYSTMS_INFL8.safetensors",
             "Wuli-Qwen-Image-2512-Turbo-LoRA-2steps-V1.0-bf16.safetensors",
             "gummycandy_qwen.safetensors", "illustration-1.0-qwen-image.safetensors",
             "qwen-360-diffusion-2512-int8-bf16-v2.safetensors",
             "qwen-image-edit-2511-multiple-angles-lora.safetensors",
             "qwen_image_union_diffsynth_lora.safetensors"),
    **_names("flux2", "Flux2TurboComfyv2.safetensors", "Flux_2-Turbo-LoRA_comfyui.safetensors"),
    **_names("flux", "uso-flux1-dit-lora-v1.safetensors"),
    # Flux Depth's LoRA widens img_in for the depth latent beside the noise (reshape_weight)
    **_names("flux_depth", "flux1-depth-dev-lora.safetensors"),
    **_names("wan21", "Wan21_CausVid_14B_T2V_lora_rank32.safetensors",
             "Wan21_CausVid_bidirect2_T2V_1_3B_lora_rank32.safetensors",
             "lightx2v_I2V_14B_480p_cfg_step_distill_rank64_bf16.safetensors",
             "lightx2v_T2V_14B_cfg_step_distill_v2_lora_rank64_bf16.safetensors",
             "wan2.1_SCAIL_2_DPO_lora_bf16.safetensors", "wan_alpha_2.1_rgba_lora.safetensors",
             "chronoedit_distill_lora.safetensors", "removal_timestep_alpha-2-1740.safetensors"),
    **_names("wan22_a14b", "wan2.2_i2v_lightx2v_4steps_lora_v1_high_noise.safetensors",
             "wan2.2_i2v_lightx2v_4steps_lora_v1_low_noise.safetensors",
             "wan2.2_t2v_lightx2v_4steps_lora_v1.1_high_noise.safetensors",
             "wan2.2_t2v_lightx2v_4steps_lora_v1.1_low_noise.safetensors"),
    **_names("ltxav", "ltx-2-19b-distilled-lora-384.safetensors", "ltx-2-19b-ic-lora-canny-control.safetensors",
             "ltx-2-19b-ic-lora-depth-control.safetensors", "ltx-2.3-22b-distilled-lora-384.safetensors",
             "ltx-2.3-22b-ic-lora-ingredients-0.9.safetensors",
             "ltx-2.3-22b-ic-lora-union-control-ref0.5.safetensors",
             "ltx-2.3-id-lora-talkvid-3k.safetensors", "ltx2-squish.safetensors",
             "ltx-2-19b-lora-camera-control-dolly-left.safetensors",
             "ltx2.3-transition.safetensors",
             "ltx_2.3_22b_distilled_1.1_lora_dynamic_fro09_avg_rank_111_bf16.safetensors"),
    **_names("gemma3_12b", "gemma-3-12b-it-abliterated_lora_rank64_bf16.safetensors"),
    **_names("zimage", "pixel_art_style_z_image_turbo.safetensors"),
    **_names("anima", "anima-turbo-lora-v0.2.safetensors"),
    **_names("krea2", "krea2_darkbrush.safetensors", "krea2_style_reference.safetensors"),
}

OTHERS = {
    "controlnet": {**_names("qwen_image_controlnet", "Qwen-Image-2512-Fun-Controlnet-Union-2602.safetensors",
                            "Qwen-Image-InstantX-ControlNet-Inpainting.safetensors",
                            "Qwen-Image-InstantX-ControlNet-Union.safetensors"),
                   **_names("sd3_controlnet", "sd3.5_large_controlnet_blur.safetensors",
                            "sd3.5_large_controlnet_canny.safetensors",
                            "sd3.5_large_controlnet_depth.safetensors")},
    "latent_upscaler": {**_names("ltxv_latent_upscaler", "ltx-2-spatial-upscaler-x2-1.0.safetensors",
                                 "ltx-2.3-spatial-upscaler-x2-1.1.safetensors"),
                        **_names("hunyuan_video15_latent_upscaler",
                                 "hunyuanvideo15_latent_upsampler_1080p.safetensors")},
    "model_patch": {**_names("zimage_fun_controlnet", "Z-Image-Turbo-Fun-Controlnet-Union.safetensors"),
                    **_names("anima_lllite", "anima-lllite-any-test-like-v2.safetensors",
                             "anima-lllite-depth-1.safetensors", "anima-lllite-inpainting-v2.safetensors"),
                    **_names("qwen_image_diffsynth_controlnet", "qwen_image_canny_diffsynth_controlnet.safetensors"),
                    **_names("uso_projector", "uso-flux1-projector-v1.safetensors"),
                    **_names("wan21_infinitetalk", "wan2.1_infiniteTalk_multi_fp16.safetensors")},
    "style_model": _names("flux_redux", "flux1-redux-dev.safetensors"),
    "upscaler": _names("esrgan_x4", "RealESRGAN_x4plus.safetensors"),
    "audio_encoder": {**_names("wav2vec2_base", "wav2vec2-chinese-base_fp16.safetensors"),
                      **_names("wav2vec2_large", "wav2vec2_large_english_fp16.safetensors"),
                      **_names("whisper_large_v3", "whisper_large_v3_fp16.safetensors")},
    "frame_interpolation": _names("film_net", "film_net_fp16.safetensors"),
    "optical_flow": _names("raft_large", "raft_large_C_T_SKHT_V2-ff5fadd5.safetensors"),
    "background_removal": _names("birefnet", "birefnet.safetensors"),
    "geometry": {**_names("moge2", "moge_2_vitl_normal_fp16.safetensors"),
                 **_names("moge3", "moge_3_vitg_fp16.safetensors"),
                 **_names("depth_anything_3", "depth_anything_3_mono_large.safetensors")},
}

TABLES = {"diffusion": DIFFUSION, "checkpoint": CHECKPOINTS, "te": TEXT_ENCODERS,
          "vae": VAES, "clip_vision": CLIP_VISION, "lora": LORAS, **OTHERS}


class UnknownFile(LookupError):
    """A template names a file the table does not know: a listed failure."""


def architecture(loader: str, file_name: str) -> str:
    """"kind:name" of the file a template's `loader` node loads, or UnknownFile."""
    kind = LOADERS.get(loader)
    if kind is None:
        raise UnknownFile(f"{loader} is not a loader the stand-in table knows "
                          f"(known: {', '.join(sorted(LOADERS))})")
    if loader == "LTXVAudioVAELoader":           # the audio VAE inside an LTX-2 checkpoint
        kind = "vae"
    name = TABLES[kind].get(file_name)
    if name is None:
        raise UnknownFile(f"{loader} loads {file_name!r}, which the stand-in table "
                          f"(tests/templates/standins.py, {kind}) does not name")
    return f"{kind}:{name}"


def model_files(prompt: dict):
    """[(node id, loader, input name, file name)] of every model file an API prompt's
    loaders name (inputs ending in _name, or ckpt/unet/clip/vae/lora names)."""
    out = []
    for nid, node in prompt.items():
        cls = node.get("class_type", "")
        if cls not in LOADERS:
            continue
        for key, value in node.get("inputs", {}).items():
            if isinstance(value, str) and value.endswith(
                    (".safetensors", ".gguf", ".pt", ".pth", ".ckpt", ".bin", ".sft")):
                out.append((nid, cls, key, value))
    return out
